"""SentencePiece tokenizer shared by source and target: trained once, cached on disk.

Ids: PAD_ID = 0, EOS_ID = 1, UNK_ID = 2, no BOS. `Tokenizer.encode` appends EOS;
`Tokenizer.decode` stops at the first EOS, skips padding and reads an id outside the vocabulary
as UNK_ID. SentencePiece may find fewer pieces than `vocab_size` asks for (225 of 256 on the
synthetic task): `Tokenizer.vocab_size` is the real count, the ids a decoder may emit.
"""

import hashlib
import io
import os
import random
import re
from collections.abc import Iterable, Sequence

import sentencepiece as spm
from absl import logging

from relpos import json_files

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
MODEL_TYPES = ("unigram", "bpe", "word", "char")
# Sentences given to the trainer at most (a seeded sample of them beyond this).
MAX_TRAINING_SENTENCES = 2_000_000


class Tokenizer:
  """A SentencePiece model with relpos's id conventions."""
  def __init__(self, model_proto: bytes, path: str = ""):
    self._processor = spm.SentencePieceProcessor(model_proto=model_proto)
    self.path = path

  @property
  def vocab_size(self) -> int:
    return self._processor.vocab_size()

  def model_proto(self) -> bytes:
    """The serialized SentencePiece model."""
    return self._processor.serialized_model_proto()

  def sha256(self) -> str:
    """The hex SHA-256 of `model_proto`: which tokenizer a run's ids belong to."""
    return hashlib.sha256(self.model_proto()).hexdigest()

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, ending with EOS_ID."""
    return self._processor.encode(text) + [EOS_ID]

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, each ending with EOS_ID (encoded on several threads)."""
    return [ids + [EOS_ID] for ids in self._processor.encode(list(texts))]

  def decode(self, ids: Sequence[int]) -> str:
    """Text of `ids` up to the first EOS_ID; PAD_ID is skipped, ids outside
    [0, vocab_size) read as UNK_ID (SentencePiece shows it as " ⁇ ")."""
    ids = list(ids)
    if EOS_ID in ids:
      ids = ids[:ids.index(EOS_ID)]
    size = self.vocab_size
    return self._processor.decode([i if 0 <= i < size else UNK_ID for i in ids if i != PAD_ID])

  def changed_by_round_trip(self, texts: Sequence[str]) -> list[int]:
    """Indices of the texts whose words decoding their encoding does not give back:
    SentencePiece normalizes text (its default `nmt_nfkc`: compatibility characters such as
    "…" or full-width letters) and decodes characters it never saw in training as " ⁇ " (no
    byte fallback). A decoder cannot write such a text. Whitespace alone does not count
    (runs of spaces, no-break spaces): sacreBLEU's and chrF's tokenization drop it too."""
    return [
        i for i, (text, ids) in enumerate(zip(texts, self.encode_batch(texts)))
        if self.decode(ids).split() != text.split()
    ]


def check_references(tokenizer: Tokenizer, references: Sequence[str], where: str) -> list[int]:
  """Indices of the references `tokenizer` cannot give back (`Tokenizer.changed_by_round_trip`),
  with a warning naming how many and the first: no translation matches them exactly, so BLEU
  against them stays below 100 (`where` names them in it: a split or a file)."""
  changed = tokenizer.changed_by_round_trip(references)
  if changed:
    first = references[changed[0]]
    logging.warning(
        "%d of %d references of %s do not survive the tokenizer's round trip (its "
        "normalization, or characters unseen in training): no translation can match them "
        "exactly. The first (number %d): %r decodes as %r.", len(changed), len(references), where,
        changed[0] + 1, first, tokenizer.decode(tokenizer.encode(first)))
  return changed


def train_tokenizer(sentences: Iterable[str], *, vocab_size: int, model_type: str,
                    seed: int) -> Tokenizer:
  """Trains a SentencePiece model in memory (deterministic: one thread, seeded sample).

  Args:
    sentences: training text, one sentence per item (read once, as a stream).
    vocab_size: the vocabulary size (a soft limit: tiny corpora may give fewer pieces).
    model_type: one of MODEL_TYPES.
    seed: seeds the sample taken when there are more than MAX_TRAINING_SENTENCES.

  Raises:
    ValueError: an unknown model type, no sentences, or a vocabulary smaller than the text's
      distinct characters (each is a piece of its own: character_coverage=1.0).
  """
  if model_type not in MODEL_TYPES:
    raise ValueError(f"task.spm_model_type={model_type!r} is invalid: must be one of "
                     f"{', '.join(MODEL_TYPES)}.")
  sentences = _sample((s for s in sentences if s.strip()), MAX_TRAINING_SENTENCES, seed)
  if not sentences:
    raise ValueError("cannot train a tokenizer on no sentences.")
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model,
                                   vocab_size=vocab_size, model_type=model_type, pad_id=PAD_ID,
                                   eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1, hard_vocab_limit=False,
                                   character_coverage=1.0, num_threads=1, minloglevel=2,
                                   input_sentence_size=0, shuffle_input_sentence=False)
  except RuntimeError as e:
    needed = re.search(r"Vocabulary size is smaller than required_chars\. \d+ vs (\d+)", str(e))
    if needed is None:
      raise
    raise ValueError(f"config field task.vocab_size={vocab_size} is below the {needed[1]} pieces "
                     "the training text needs at least (each of its distinct characters, and "
                     "pad, eos, unk, is one): set a larger task.vocab_size.") from None
  return Tokenizer(model.getvalue())


def _sample(items: Iterable[str], size: int, seed: int) -> list[str]:
  """All items if there are at most `size`, else a seeded uniform sample of `size` of them
  (reservoir sampling: memory for `size` items only)."""
  rng = random.Random(seed)
  sample = []
  for i, item in enumerate(items):
    if i < size:
      sample.append(item)
    elif (j := rng.randrange(i + 1)) < size:
      sample[j] = item
  return sample


def load_or_train_tokenizer(path: str, sentences: Iterable[str], *, vocab_size: int,
                            model_type: str, seed: int) -> Tokenizer:
  """The tokenizer cached at `path`, trained on `sentences` and written there (atomically) first.

  Args:
    path: the `.model` file; its folder is created when missing.
    sentences: training text, read only when the model must be trained (e.g. a generator).
    vocab_size, model_type, seed: see `train_tokenizer`.

  A cached file that SentencePiece cannot read (damaged) is moved to `<path>.damaged`, with a
  warning, and the tokenizer trained again.
  """
  if not os.path.exists(path):
    tokenizer = train_tokenizer(sentences, vocab_size=vocab_size, model_type=model_type, seed=seed)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    json_files.write_bytes(path, tokenizer.model_proto())
  with open(path, "rb") as f:
    proto = f.read()
  try:
    return Tokenizer(proto, path)
  except RuntimeError as e:  # SentencePiece cannot parse the file
    aside = f"{path}.damaged"
    os.replace(path, aside)
    logging.warning(
        "%s is not a SentencePiece model (%s): moved to %s; training the tokenizer "
        "again (the same seeded training gives the same tokenizer).", path,
        str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__, aside)
    return load_or_train_tokenizer(path, sentences, vocab_size=vocab_size, model_type=model_type,
                                   seed=seed)
