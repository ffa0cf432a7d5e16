"""Why translations of longer sentences fail: length diagnostics of a restored model
(docs/length.md).

Computed by `relpos.experiments.single_run.evaluate_run` on every held-out split of a run's task
and stored in its result.json (results schema 5):

- `length_statistics`: the hypothesis/reference length ratio, in target tokens (pieces of the
  task's SentencePiece tokenizer, eos excluded; hypotheses and references both re-encoded from
  their text), and the shares of hypotheses shorter ("stop early") and longer ("run long")
  than their reference, overall and by source-length bin (`source_length_bins`: the bins of
  `bleu_by_source_length`). Varis & Bojar (2021) find the drop on long sentences tracks the
  output length.
- `oracle_length_scores`: BLEU when beam search may end only at the reference's length in
  target tokens (eos forbidden before it, forced at it; Newman et al. 2020): what is left of
  the drop once the length is right is content, not the end-of-sentence decision.
- `token_accuracy_by_position`: teacher-forced accuracy of the argmax next token by target
  position, up to 2 x task.max_length (the training length), and on eos tokens alone.
- the encoder's attention on test and test_long sources beside each other
  (`relpos.attention_statistics.attention_profile`).

Beside the scores, `bleu_by_subset` scores what a held-out split holds (`Task.subsets`: the
synthetic task's test_long by construction), so a table says how much of the drop on longer
sentences is a construction never seen in training rather than length.
"""
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import sacrebleu
from flax import nnx

from relpos import evaluate
from relpos import run_config
from relpos import scoring
from relpos.data import pipeline
from relpos.data import tokenizer as tokenizer_lib

NUM_LENGTH_BUCKETS = 4
LENGTH_UNIT = "target tokens (the task's SentencePiece pieces, eos excluded)"


def bleu_by_subset(translations: Sequence[str], references: Sequence[str],
                   subsets: Sequence[tuple[str, list[int]]], language: str) -> dict[str, dict]:
  """Subset name -> {"num_sentences", "bleu" (cased sacreBLEU; None for an empty subset)} of
  (name, sentence indices) `subsets` of a split's translations."""
  def bleu(indices: list[int]) -> float:
    hypotheses, wanted = [translations[i] for i in indices], [references[i] for i in indices]
    return scoring.score(hypotheses, wanted, language=language)["bleu"]

  return {
      name: {"num_sentences": len(indices), "bleu": bleu(indices) if indices else None}
      for name, indices in subsets
  }


def length_edges(sources: Sequence[str], num_buckets: int = NUM_LENGTH_BUCKETS) -> list[int]:
  """Lower bounds of equal-width source-length buckets (words) covering `sources`."""
  lengths = [len(s.split()) for s in sources]
  low, high = min(lengths), max(lengths)
  width = max(1, math.ceil((high - low + 1) / num_buckets))
  return list(range(low, high + 1, width))


def source_length_bins(sources: Sequence[str]) -> dict[str, list[int]]:
  """Equal-width source-length buckets (words) -> the indices of their sources, keyed
  "low-high" (inclusive) or "low" for a bucket of one length; empty buckets left out."""
  edges = length_edges(sources)
  uppers = [e - 1 for e in edges[1:]] + [max(len(s.split()) for s in sources)]
  bins = {}
  for low, high in zip(edges, uppers):
    picked = [i for i, s in enumerate(sources) if low <= len(s.split()) <= high]
    if picked:
      bins[f"{low}-{high}" if high > low else f"{low}"] = picked
  return bins


def bleu_by_source_length(sources: Sequence[str], hypotheses: Sequence[str],
                          references: Sequence[str]) -> dict[str, float]:
  """Corpus sacreBLEU per source-length bucket (`source_length_bins`)."""
  return {
      label: sacrebleu.corpus_bleu(
          [hypotheses[i]
           for i in picked],
          [[references[i]
            for i in picked]]).score for label, picked in source_length_bins(sources).items()
  }


def _length_summary(hypothesis_lengths: np.ndarray,
                    reference_lengths: np.ndarray) -> dict[str, float]:
  """Corpus length ratio (sum of hypothesis over sum of reference lengths) and the shares of
  hypotheses shorter and longer than their reference."""
  return {
      "ratio": float(hypothesis_lengths.sum() / max(reference_lengths.sum(), 1)),
      "shorter": float(np.mean(hypothesis_lengths < reference_lengths)),
      "longer": float(np.mean(hypothesis_lengths > reference_lengths)),
      "num_sentences": int(len(hypothesis_lengths))
  }


def token_lengths(tokenizer: tokenizer_lib.Tokenizer, texts: Sequence[str]) -> np.ndarray:
  """int [len(texts)]: each text's length in tokens, eos excluded."""
  return np.array([len(ids) - 1 for ids in tokenizer.encode_batch(list(texts))], np.int64)


def length_statistics(tokenizer: tokenizer_lib.Tokenizer, sources: Sequence[str],
                      hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
  """How hypothesis lengths compare with the references', overall and by source length.

  Returns:
    {"unit": LENGTH_UNIT, "ratio", "shorter", "longer", "num_sentences",
     "by_source_length": {bucket: {"ratio", "shorter", "longer", "num_sentences"}}}.
  """
  hypothesis, reference = token_lengths(tokenizer, hypotheses), token_lengths(tokenizer, references)
  return {
      "unit": LENGTH_UNIT, **_length_summary(hypothesis, reference), "by_source_length": {
          label: _length_summary(hypothesis[picked], reference[picked])
          for label, picked in source_length_bins(sources).items()
      }
  }


def oracle_length_scores(model: nnx.Module, task: pipeline.Task, split: str,
                         config: run_config.RunConfig, *,
                         mesh: jax.sharding.Mesh) -> dict[str, Any]:
  """Scores of a split translated at the references' lengths (oracle-length decoding).

  Each output is made exactly as long as its reference in target tokens (eos included; at
  most model.max_len): beam search forbids eos before that length and forces it there.

  Returns:
    `scoring.score`'s dict plus "bleu_by_source_length" (bucket -> BLEU) and "length_ratio"
    (of the outputs re-encoded from their text: about 1, a check of the constraint).
  """
  sources, references = task.source_texts(split), task.target_texts(split)
  lengths = [min(len(ids), config.model.max_len) for ids in task.tokenizer.encode_batch(references)]
  translations = evaluate.translate_texts(model, task.tokenizer, sources, config, mesh=mesh,
                                          lengths=lengths)
  ratio = (token_lengths(task.tokenizer, translations).sum() /
           max(token_lengths(task.tokenizer, references).sum(), 1))
  scores = scoring.score(translations, references, language=config.task.target_lang)
  return {
      **scores, "bleu_by_source_length": bleu_by_source_length(sources, translations, references),
      "length_ratio": float(ratio)
  }


@nnx.jit
def _predicted_tokens(model: nnx.Module, inputs: jax.Array, targets: jax.Array) -> jax.Array:
  """The argmax token [batch, t] the teacher-forced model predicts at each target position."""
  return model(inputs, targets).argmax(-1)


def token_accuracy_by_position(model: nnx.Module, task: pipeline.Task, split: str, *,
                               batch_size: int, num_positions: int) -> dict[str, Any]:
  """Teacher-forced accuracy of the argmax next token by target position.

  Args:
    model: a restored Transformer.
    task: its task.
    split: the split to score (every sentence).
    batch_size: sentences per forward pass.
    num_positions: positions 0 .. num_positions - 1 are reported.

  Returns:
    {"accuracy": [num_positions] (None where no target is that long), "count":
     [num_positions] target tokens at each position, "eos_accuracy": accuracy on the eos
     tokens alone (the decision to stop), "early_eos": the share of the other target tokens
     where eos is predicted instead (a stop before the target's end, from 28 November 2026),
     "accuracy_all": on every target token}.
  """
  correct, count = np.zeros(num_positions, np.int64), np.zeros(num_positions, np.int64)
  eos_correct = eos_count = all_correct = all_count = early_eos = 0
  for batch in task.eval_batches(split, batch_size, max_len=model.config.max_len):
    targets = batch["targets"]  # [batch, t]
    predicted = np.asarray(_predicted_tokens(model, batch["inputs"], targets))  # [batch, t]
    real = targets != tokenizer_lib.PAD_ID
    right = (predicted == targets) & real
    width = min(num_positions, targets.shape[1])
    correct[:width] += right.sum(0)[:width]
    count[:width] += real.sum(0)[:width]
    is_eos = targets == tokenizer_lib.EOS_ID
    eos_correct += int((right & is_eos).sum())
    eos_count += int(is_eos.sum())
    early_eos += int(((predicted == tokenizer_lib.EOS_ID) & real & ~is_eos).sum())
    all_correct += int(right.sum())
    all_count += int(real.sum())
  return {
      "accuracy": [float(c / n) if n else None for c, n in zip(correct, count)],
      "count": count.tolist(), "eos_accuracy": eos_correct / max(eos_count, 1),
      "early_eos": early_eos / max(all_count - eos_count, 1),
      "accuracy_all": all_correct / max(all_count, 1)
  }
