"""Tests of relpos.scoring: sacreBLEU's scores and BLEU on Moses-tokenized lower-cased text."""
import pytest
from sacrebleu import metrics as sacrebleu_metrics

from relpos import scoring


def test_score_reports_cased_and_lowercased_bleu_with_signatures():
  hypotheses = ["The cat sat on the mat .", "a dog runs"]
  references = ["the cat sat on the mat .", "A dog runs"]
  scores = scoring.score(hypotheses, references, language="en")
  assert scores["bleu_lowercase"] == pytest.approx(100.0)
  assert scores["bleu"] < 100.0
  assert "case:mixed" in scores["signature"]
  assert "case:lc" in scores["lowercase_signature"]
  assert scores["num_sentences"] == 2


@pytest.mark.parametrize(
    "text, language, tokenized",
    [
        # Punctuation split off, quotes and apostrophes escaped as tokenizer.perl does; German
        # splits an apostrophe from both sides (Multi30K's files: "what &apos; s").
        ('Ein Mann sagt: "Hallo!"', "de", "ein mann sagt : &quot; hallo ! &quot;"),
        ("Zwei Hunde rennen durch's Gras.", "de", "zwei hunde rennen durch &apos; s gras ."),
        # English keeps the apostrophe on the clitic.
        ("The dog's ball.", "en", "the dog &apos;s ball ."),
        # normalize-punctuation: typographic quotes and dashes become ASCII ones.
        ("Ein Mann – mit „Hut“.", "de", "ein mann - mit &quot; hut &quot; ."),
        # A hyphenated word stays whole (tokenizer.perl without -a, as Multi30K's script).
        ("Ein saftig-grünes Gras.", "de", "ein saftig-grünes gras ."),
        # A language Moses has no rules for gets its generic ones, not an error.
        ("Hello, world!", "xx", "hello , world !"),
    ])
def test_moses_lowercase_tokenized_follows_multi30k_preprocessing(text, language, tokenized):
  assert scoring.moses_lowercase_tokenized([text], language) == [tokenized]


def test_tokenized_bleu_ignores_case_and_punctuation_style_that_sacrebleu_counts():
  """Typographic against ASCII quotes and a colon's spacing cost cased and lower-cased
  sacreBLEU; after Moses's normalization and tokenization the two texts are the same."""
  scores = scoring.score(["Ein Mann sagt: „Hallo“."], ['ein Mann sagt : "Hallo".'], language="de")
  assert scores["bleu_tokenized_lowercase"] == pytest.approx(100.0)
  assert scores["bleu_lowercase"] < 50.0
  assert scores["bleu"] < scores["bleu_lowercase"]


def test_tokenized_bleu_counts_ngrams_of_the_moses_tokens_and_names_its_preprocessing():
  hypotheses = ["Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch, draußen."]
  references = ["Zwei Hunde spielen im Gras.", "Eine Frau liest draußen ein Buch."]
  scores = scoring.score(hypotheses, references, language="de")
  expected = sacrebleu_metrics.BLEU(tokenize="none").corpus_score(
      ["zwei hunde spielen im schnee .", "eine frau liest ein buch , draußen ."],
      [["zwei hunde spielen im gras .", "eine frau liest draußen ein buch ."]])
  assert scores["bleu_tokenized_lowercase"] == pytest.approx(expected.score)
  assert 0.0 < scores["bleu_tokenized_lowercase"] < 100.0
  signature = scores["tokenized_lowercase_signature"]
  assert signature.startswith("pre:moses-lc-norm-tok:de|sacremoses:")
  assert "tok:none" in signature
