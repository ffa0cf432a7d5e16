"""Tests for relpos.data.synthetic: the grammar, its word-order property, the TFDS builder."""

from collections import Counter

from relpos.data import synthetic


def test_generation_is_deterministic_and_in_length_range():
  first = synthetic.generate(200, 3, 12, seed=7)
  assert first == synthetic.generate(200, 3, 12, seed=7)
  assert first != synthetic.generate(200, 3, 12, seed=8)
  assert all(3 <= len(source.split()) <= 12 for source, _ in first)
  long = synthetic.generate(50, 13, 24, seed=7)
  assert all(13 <= len(source.split()) <= 24 for source, _ in long)


def test_target_has_own_lexicon_verb_final_and_case_marking():
  clause = synthetic.Clause(
      subject=synthetic.NounPhrase("the", ["big"], "dog", False),
      verb="see", obj=synthetic.NounPhrase("a", [], "cat", False), adjunct=None)
  source, target = synthetic._sentence([clause])  # pylint: disable=protected-access
  lex = synthetic.LEXICON
  assert source == "the big dog sees a cat"
  # Subject (noun-adjective-determiner, case -a), object (case -o), verb last (-t: singular).
  assert target.split() == [lex["dog"] + "a", lex["big"], lex["the"], lex["cat"] + "o", lex["a"],
                            lex["see"] + "t"]
  swapped_source, swapped_target = synthetic._sentence([clause.swapped()])  # pylint: disable=protected-access
  assert Counter(swapped_source.split()) == Counter(source.split())
  assert swapped_target != target


def test_plural_subject_changes_verb_agreement_and_noun():
  subject = synthetic.NounPhrase("the", [], "dog", True)
  clause = synthetic.Clause(subject, "sleep", None, ("under", synthetic.NounPhrase(
      "a", [], "tree", False)))
  source, target = synthetic._sentence([clause])  # pylint: disable=protected-access
  lex = synthetic.LEXICON
  assert source == "the dogs sleep under a tree"
  assert target.split() == [lex["dog"] + "mia", lex["the"], lex["tree"] + "e", lex["a"],
                            lex["under"], lex["sleep"] + "n"]


def test_test_split_holds_word_order_ambiguity():
  splits = synthetic.SyntheticParams(num_train=10, num_validation=10, num_test=400,
                                     num_test_long=10).splits()
  fraction = synthetic.permutation_fraction(splits["test"])
  assert 0.2 < fraction < 0.6
  # No bag-of-words function can be right on both members of such a pair.
  by_bag = {}
  for source, target in splits["test"]:
    by_bag.setdefault(tuple(sorted(source.split())), set()).add(target)
  assert any(len(targets) > 1 for targets in by_bag.values())
  assert synthetic.permutation_fraction([("a b", "x"), ("b a", "y"), ("c", "z")]) == 2 / 3


def test_changed_parameters_get_another_builder_config_name():
  assert synthetic.SyntheticParams().name() == synthetic.SyntheticParams().name()
  assert synthetic.SyntheticParams(num_train=5).name() != synthetic.SyntheticParams().name()
