"""Scores of translations against their references: relpos's headline BLEU and the literature's.

relpos's headline is cased sacreBLEU (13a tokenization) on detokenized output, with lower-cased
sacreBLEU and chrF beside it, each with its sacreBLEU signature. Much of the literature
(the multimodal-translation papers on Multi30K, older WMT papers) instead reports multi-bleu.perl
or fairseq BLEU on text that Moses's scripts lower-cased, punctuation-normalized and tokenized:
Multi30K's own `scripts/task1-tokenize.sh` makes its `*.lc.norm.tok.*` files by

  lowercase.perl | normalize-punctuation.perl -l LANG | tokenizer.perl -l LANG

`moses_lowercase_tokenized` runs the same three steps with sacremoses, the Python port of those
scripts (it reproduces 4,027 of the 4,028 lines of Multi30K's tokenized test_2016_flickr and val
files, English and German), and `score` counts BLEU on its tokens with sacreBLEU's tokenizer off,
as multi-bleu.perl does: "bleu_tokenized_lowercase", the closest equivalent of such a paper's
number that detokenized output allows.
"""
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import sacremoses
from sacrebleu import metrics as sacrebleu_metrics


def moses_lowercase_tokenized(texts: Sequence[str], language: str) -> list[str]:
  """`texts` lower-cased, punctuation-normalized and tokenized as Moses's scripts do for
  `language` (an ISO 639-1 code, e.g. "de"; one Moses lacks rules for is tokenized by its
  generic ones), tokens joined by single spaces, special characters escaped (`&quot;`).

  Args:
    texts: [sentences] detokenized text.

  Returns:
    [sentences] the tokenized text, one string per sentence.
  """
  normalizer = sacremoses.MosesPunctNormalizer(lang=language)
  tokenizer = sacremoses.MosesTokenizer(lang=language)
  return [
      tokenizer.tokenize(normalizer.normalize(text.lower()), escape=True, return_str=True)
      for text in texts
  ]


def tokenized_lowercase_signature(bleu: sacrebleu_metrics.BLEU, language: str) -> str:
  """The signature of BLEU on `moses_lowercase_tokenized` text: the preprocessing, then
  sacreBLEU's own signature (whose `tok:none` says it only splits at spaces)."""
  return (f"pre:moses-lc-norm-tok:{language}|sacremoses:{metadata.version('sacremoses')}|"
          f"{bleu.get_signature()}")


def score(hypotheses: Sequence[str], references: Sequence[str], *, language: str) -> dict[str, Any]:
  """Corpus scores of detokenized `hypotheses` against `references` (one reference each).

  Args:
    hypotheses, references: [sentences] detokenized text, aligned.
    language: the text's language (the task's target language), for Moses's rules.

  Returns:
    {"bleu", "signature": cased sacreBLEU (13a); "bleu_lowercase", "lowercase_signature": the
    same lower-cased; "chrf", "chrf_signature"; "bleu_tokenized_lowercase",
    "tokenized_lowercase_signature": BLEU on `moses_lowercase_tokenized` text; "num_sentences"}.
  """
  hypotheses, references = list(hypotheses), [list(references)]
  bleu, lowercase = sacrebleu_metrics.BLEU(), sacrebleu_metrics.BLEU(lowercase=True)
  chrf, tokenized = sacrebleu_metrics.CHRF(), sacrebleu_metrics.BLEU(tokenize="none", force=True)
  tokenized_hypotheses = moses_lowercase_tokenized(hypotheses, language)
  tokenized_references = [moses_lowercase_tokenized(references[0], language)]
  return {
      "bleu": bleu.corpus_score(hypotheses, references).score,
      "signature": str(bleu.get_signature()),
      "bleu_lowercase": lowercase.corpus_score(hypotheses, references).score,
      "lowercase_signature": str(lowercase.get_signature()),
      "chrf": chrf.corpus_score(hypotheses, references).score,
      "chrf_signature": str(chrf.get_signature()),
      "bleu_tokenized_lowercase": tokenized.corpus_score(tokenized_hypotheses,
                                                         tokenized_references).score,
      "tokenized_lowercase_signature": tokenized_lowercase_signature(tokenized, language),
      "num_sentences": len(hypotheses),
  }
