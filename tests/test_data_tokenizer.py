"""Tests for relpos.data.tokenizer: round trip, ids, caching, determinism."""

import os

import pytest

from relpos.data import tokenizer as tokenizer_lib

SENTENCES = [
    "the dog sees the cat", "a small bird sings near the river", "Zwei Hunde spielen im Schnee.",
    "le chat dort"
] * 50


def test_round_trip_and_special_ids(tmp_path):
  tok = tokenizer_lib.load_or_train_tokenizer(str(tmp_path / "t.model"), SENTENCES, vocab_size=60,
                                              model_type="unigram", seed=0)
  for text in SENTENCES[:4]:
    ids = tok.encode(text)
    assert ids[-1] == tokenizer_lib.EOS_ID
    assert tokenizer_lib.PAD_ID not in ids
    assert tok.decode(ids) == text
    assert tok.decode(ids + [5, 6, tokenizer_lib.PAD_ID]) == text  # stops at EOS
  assert tok.decode([tokenizer_lib.PAD_ID] + tok.encode("le chat")[:-1]) == "le chat"


def test_texts_the_round_trip_changes_are_named(tmp_path):
  tok = tokenizer_lib.load_or_train_tokenizer(str(tmp_path / "t.model"), SENTENCES, vocab_size=60,
                                              model_type="unigram", seed=0)
  texts = [
      "the dog sees the cat", "the  dog", "le\xa0chat", "the dog ✓", " the cat", "ｔｈｅ cat",
      "le chat…"
  ]
  # An unseen character reads " ⁇ "; nmt_nfkc writes full-width letters and "…" otherwise. Runs
  # of spaces, a leading one and a no-break space change nothing BLEU or chrF sees.
  assert tok.changed_by_round_trip(texts) == [3, 5, 6]
  assert [tok.decode(tok.encode(texts[i])) for i in (3, 5, 6)
         ] == ["the dog  ⁇ ", "the cat", "le chat..."]
  assert tok.changed_by_round_trip([]) == []


def test_tokenizer_smaller_than_requested_decodes_every_id(tmp_path):
  """SentencePiece gives fewer pieces than asked on a small corpus; decode never fails."""
  tok = tokenizer_lib.load_or_train_tokenizer(str(tmp_path / "t.model"), SENTENCES, vocab_size=200,
                                              model_type="unigram", seed=0)
  assert tok.vocab_size < 200
  ids = tok.encode("the dog")[:-1]
  unknown = tok.decode([tokenizer_lib.UNK_ID])
  assert unknown.strip() == "⁇"
  for bad in (tok.vocab_size, 199, 10_000, -3):
    assert tok.decode(ids + [bad] + ids) == tok.decode(ids + [tokenizer_lib.UNK_ID] + ids)


def test_cached_model_is_reused_and_training_deterministic(tmp_path):
  path = str(tmp_path / "sub" / "t.model")
  first = tokenizer_lib.load_or_train_tokenizer(path, SENTENCES, vocab_size=50, model_type="bpe",
                                                seed=0)
  assert os.path.exists(path) and first.path == path
  again = tokenizer_lib.load_or_train_tokenizer(path, iter(()), vocab_size=50, model_type="bpe",
                                                seed=0)
  other = tokenizer_lib.load_or_train_tokenizer(str(tmp_path / "u.model"), SENTENCES, vocab_size=50,
                                                model_type="bpe", seed=0)
  for text in SENTENCES[:4]:
    assert first.encode(text) == again.encode(text) == other.encode(text)
  assert [p for p in os.listdir(tmp_path / "sub")] == ["t.model"]  # no temporary left


def test_encode_batch_matches_encode(tmp_path):
  tok = tokenizer_lib.load_or_train_tokenizer(str(tmp_path / "t.model"), SENTENCES, vocab_size=60,
                                              model_type="unigram", seed=0)
  assert tok.encode_batch(SENTENCES[:4]) == [tok.encode(text) for text in SENTENCES[:4]]


def test_training_sample_is_seeded(monkeypatch):
  """Above MAX_TRAINING_SENTENCES, a seeded sample is trained on: same seed, same model."""
  monkeypatch.setattr(tokenizer_lib, "MAX_TRAINING_SENTENCES", 20)
  corpus = [
      f"sentence number {i} says {'ab' * (i % 7)} {'xyz'[i % 3] * (i % 5)}" for i in range(300)
  ]

  def train(seed):
    return tokenizer_lib.train_tokenizer(iter(corpus), vocab_size=40, model_type="bpe",
                                         seed=seed).model_proto()

  assert train(0) == train(0)
  assert train(0) != train(1)


def test_bad_arguments():
  with pytest.raises(ValueError, match="task.spm_model_type='wordpiece'"):
    tokenizer_lib.train_tokenizer(SENTENCES, vocab_size=50, model_type="wordpiece", seed=0)
  with pytest.raises(ValueError, match="no sentences"):
    tokenizer_lib.train_tokenizer(["", " "], vocab_size=50, model_type="bpe", seed=0)


def test_a_vocabulary_below_the_text_characters_is_named_in_one_line():
  """SentencePiece's own error is a RuntimeError naming a flag relpos does not expose."""
  sentences = ["the dog sees the cat", "a small bird sings near the river"] * 20
  with pytest.raises(
      ValueError, match=(r"^config field task.vocab_size=10 is below the 20 "
                         r"pieces the training text needs at least")):
    tokenizer_lib.train_tokenizer(sentences, vocab_size=10, model_type="unigram", seed=0)
