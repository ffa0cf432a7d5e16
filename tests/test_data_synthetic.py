"""Tests for relpos.data.synthetic: the grammar, its word-order property, the TFDS builder."""

import dataclasses
import os
import re
from collections import Counter

import pytest
from absl import logging

from configs import default
from relpos.data import synthetic

SMALL = {"num_train": 60, "num_validation": 10, "num_test": 40, "num_test_long": 8}


def _task_config(data_dir, **synthetic_fields):
  config = default.get_config().task
  config.tfds_data_dir = str(data_dir)
  config.synthetic.update({**SMALL, **synthetic_fields})
  return config


def _pairs(dataset, split):
  source = dataset.data_sources()[split]
  return [(source[i]["source"].decode(), source[i]["target"].decode()) for i in range(len(source))]


def test_generation_is_deterministic_and_in_length_range():
  first = synthetic.generate(200, 3, 12, seed=7)
  assert first == synthetic.generate(200, 3, 12, seed=7)
  assert first != synthetic.generate(200, 3, 12, seed=8)
  assert all(3 <= len(source.split()) <= 12 for source, _ in first)
  long = synthetic.generate(50, 13, 24, seed=7)
  assert all(13 <= len(source.split()) <= 24 for source, _ in long)


def test_target_has_own_lexicon_verb_final_and_case_marking():
  clause = synthetic.Clause(subject=synthetic.NounPhrase("the", ["big"], "dog", False), verb="see",
                            obj=synthetic.NounPhrase("a", [], "cat", False), adjunct=None)
  source, target = synthetic._sentence([clause])  # pylint: disable=protected-access
  lex = synthetic.LEXICON
  assert source == "the big dog sees a cat"
  # Subject (noun-adjective-determiner, case -a), object (case -o), verb last (-t: singular).
  assert target.split() == [
      lex["dog"] + "a", lex["big"], lex["the"], lex["cat"] + "o", lex["a"], lex["see"] + "t"
  ]
  swapped_source, swapped_target = synthetic._sentence([clause.swapped()])  # pylint: disable=protected-access
  assert Counter(swapped_source.split()) == Counter(source.split())
  assert swapped_target != target


def test_plural_subject_changes_verb_agreement_and_noun():
  subject = synthetic.NounPhrase("the", [], "dog", True)
  clause = synthetic.Clause(subject, "sleep", None,
                            ("under", synthetic.NounPhrase("a", [], "tree", False)))
  source, target = synthetic._sentence([clause])  # pylint: disable=protected-access
  lex = synthetic.LEXICON
  assert source == "the dogs sleep under a tree"
  assert target.split() == [
      lex["dog"] + "mia", lex["the"], lex["tree"] + "e", lex["a"], lex["under"], lex["sleep"] + "n"
  ]


def test_test_split_holds_word_order_ambiguity():
  splits = synthetic.SyntheticParams(num_train=10, num_validation=10, num_test=400,
                                     num_test_long=10).splits()
  fraction = synthetic.permutation_fraction(splits["test"])
  assert 0.2 < fraction < 0.6
  # No bag-of-words function can be right on both members of such a pair.
  by_bag = {}
  for source, target in splits["test"]:
    by_bag.setdefault(tuple(sorted(source.split())), set()).add(target)
  ambiguous = [targets for targets in by_bag.values() if len(targets) > 1]
  assert sum(map(len, ambiguous)) == round(fraction * 400)  # all test sources are distinct
  assert synthetic.permutation_fraction([("a b", "x"), ("b a", "y"), ("c", "z")]) == 2 / 3
  assert synthetic.permutation_fraction(splits["train"]) < fraction  # no swaps added there


def test_length_ranges_are_checked():
  with pytest.raises(
      ValueError, match="task.synthetic.max_words=2 must be at least "
      "task.synthetic.min_words=1 and at least 3"):
    synthetic.SyntheticParams(min_words=1, max_words=2)
  with pytest.raises(ValueError, match="long_min_words=12 must exceed task.synthetic.max_words=12"):
    synthetic.SyntheticParams(long_min_words=12)
  with pytest.raises(ValueError, match="long_max_words=14 must be at least "
                     "task.synthetic.long_min_words=15"):
    synthetic.SyntheticParams(long_min_words=15, long_max_words=14)


def test_splits_come_from_distinct_seeds():
  splits = synthetic.SyntheticParams(num_train=50, num_validation=50, num_test=50,
                                     num_test_long=5).splits()
  shifted = synthetic.SyntheticParams(seed=1235, num_train=50, num_validation=50, num_test=50,
                                      num_test_long=5).splits()
  assert splits["train"] != splits["validation"] != shifted["train"]
  assert splits == synthetic.SyntheticParams(num_train=50, num_validation=50, num_test=50,
                                             num_test_long=5).splits()


def test_changed_parameters_get_another_builder_config_name():
  assert synthetic.SyntheticParams().name() == synthetic.SyntheticParams().name()
  assert synthetic.SyntheticParams(num_train=5).name() != synthetic.SyntheticParams().name()
  # The name of the defaults before test_long_seen existed: their prepared data is reused.
  assert synthetic.SyntheticParams().name() == "pd627f0437c44"
  assert synthetic.SyntheticParams(num_test_long_seen=5).name() != "pd627f0437c44"


def test_test_long_seen_is_long_sentences_of_seen_constructions_and_changes_no_other_split():
  without = synthetic.SyntheticParams(num_train=50, num_validation=50, num_test=50,
                                      num_test_long=50)
  params = dataclasses.replace(without, num_test_long_seen=200)
  assert without.split_names() == ("train", "validation", "test", "test_long")
  assert params.split_names() == synthetic.SPLITS
  splits, before = params.splits(), without.splits()
  assert {name: splits[name] for name in before} == before
  seen = splits["test_long_seen"]
  assert len(seen) == 200 and not set(seen) & set(splits["test_long"])
  lengths = [len(source.split()) for source, _ in seen]
  assert min(lengths) >= 13 and max(lengths) <= synthetic.SEEN_MAX_WORDS
  assert {synthetic.long_sentence_construction(source) for source, _ in seen
         } == {synthetic.SEEN_CONSTRUCTIONS}
  assert synthetic.subsets_of("test_long_seen", seen, set()) == []
  with pytest.raises(
      ValueError, match=re.escape(
          "config field task.synthetic.num_test_long_seen=200 needs task.synthetic.long_min_words "
          "<= 20 (the longest sentence of seen constructions), not 21.")):
    dataclasses.replace(params, long_min_words=21, long_max_words=30)


def test_builder_writes_every_split_in_order_and_reports_the_fraction(tmp_path, caplog):
  config = _task_config(tmp_path, num_test_long_seen=10)
  with caplog.at_level(logging.INFO):
    dataset = synthetic.load(config, str(tmp_path))
  generated = synthetic.SyntheticParams.of(config).splits()
  assert dataset.splits == synthetic.SPLITS
  for split in synthetic.SPLITS:
    assert _pairs(dataset, split) == generated[split]  # stored in generation order
  fraction = synthetic.permutation_fraction(generated["test"])
  assert fraction > 0
  assert dataset.builder.info.metadata["test_permutation_fraction"] == fraction
  assert f"{100 * fraction:.1f}% of its sources are word-order permutations" in caplog.text
  # Prepared once: loading again reuses the files and the metadata.
  again = synthetic.load(config, str(tmp_path))
  assert again.builder.info.metadata["test_permutation_fraction"] == fraction
  assert _pairs(again, "test") == generated["test"]


def test_changed_parameters_build_a_new_dataset(tmp_path):
  first = synthetic.load(_task_config(tmp_path), str(tmp_path))
  resized = synthetic.load(_task_config(tmp_path, num_train=70), str(tmp_path))
  reseeded = synthetic.load(_task_config(tmp_path, seed=7), str(tmp_path))
  assert [len(d.data_sources()["train"]) for d in (first, resized, reseeded)] == [60, 70, 60]
  assert _pairs(reseeded, "train") != _pairs(first, "train")
  assert len(os.listdir(tmp_path / "synthetic_translation")) == 3


def test_clauses_are_counted_by_the_grammars_conjunction():
  assert synthetic.clause_count("the cat sees a dog") == 1
  assert synthetic.clause_count("the cat sees a dog and a bird sleeps") == 2
  pairs = synthetic.generate(200, 13, 24, "long")
  assert {synthetic.clause_count(s) for s, _ in pairs} == {1, 2}
  assert all((" and " in s) == (" ke " in t) for s, t in pairs)  # "and" is "ke" in the target
  assert all(synthetic.clause_count(s) == 1 for s, _ in synthetic.generate(200, 3, 12, "x"))


def test_subsets_split_every_sentence_once():
  train = [("a", "x"), ("b", "y")]
  test = [("a", "x"), ("a", "z"), ("c", "w")]  # a seen pair, a seen source with another target
  assert synthetic.subsets_of("test", test, set(train)) == [("in training", [0]),
                                                            ("not in training", [1, 2])]
  long = [("p and q", "1"), ("p", "2"), ("p and q", "3"), ("p that q that r", "4")]
  assert synthetic.subsets_of("test_long", long, set()) == [("seen constructions", [1]),
                                                            ("2 relative clauses", [3]),
                                                            ("2 clauses", [0, 2])]


def test_training_sentences_hold_only_the_seen_constructions():
  """No sentence of training's lengths (3-12 words) joins two clauses or holds two relative
  clauses: test_long's 'seen constructions' differ from training by length alone."""
  train = synthetic.generate(3000, 3, 12, "train")
  assert {synthetic.long_sentence_construction(s) for s, _ in train} == {"seen constructions"}
  assert max(synthetic.relative_clause_count(s) for s, _ in train) == 1
  long = synthetic.generate(500, 13, 24, "long")
  assert {synthetic.long_sentence_construction(s) for s, _ in long
         } == {"seen constructions", "2 relative clauses", "2 clauses"}
