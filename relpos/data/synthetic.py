"""A synthetic translation task where word order matters, generated from a seed (no download).

Source: English-like sentences. Target: an invented language with
- its own lexicon (fixed, made of invented syllables);
- another word order: subject-object-verb, nouns before their adjectives, the determiner last
  in its noun phrase, postpositions instead of prepositions, relative clauses before the noun,
  and the verb after its prepositional phrase;
- marking that depends on syntactic role: a case suffix on every noun (-a subject, -o object,
  -e after a postposition), a plural suffix -mi, and a verb suffix agreeing in number with the
  subject (-t singular, -n plural; -ri inside a relative clause).

"the big dog sees a cat" -> "dogua bigu na cato ul sehet" (schematically), while
"a cat sees the big dog" has the same words and another target: a bag-of-words model cannot
tell who does what. The test split deliberately holds such subject/object swaps, and
`permutation_fraction` reports how many test sources share their bag of words with another
test source whose target differs.

Splits: train, validation and test over [min_words, max_words] source words; test_long over
[long_min_words, long_max_words] (longer than any training sentence). A sentence joins one or
more clauses with "and" ("ke"), up to round(max_words / 12) of them: with the defaults (12 and
24 words) no training sentence joins two clauses and most test_long sentences do, so test_long
tests that construction besides length (`relpos.experiments.synthetic_subsets` scores the two
apart). test_long_seen (num_test_long_seen pairs; none by default) draws test_long's range but
keeps only sentences of constructions seen in training (`SEEN_CONSTRUCTIONS`): length alone.
Each split comes from its own seed; the grammar repeats short sentences, so some validation and
test pairs also occur in training.
"""

import dataclasses
import hashlib
import json
import random
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

import ml_collections
import tensorflow_datasets as tfds
from absl import logging

from relpos.data import datasets

NOUNS = ("dog", "cat", "bird", "horse", "farmer", "child", "teacher", "doctor", "king", "queen",
         "girl", "boy", "fox", "wolf", "sailor", "singer", "baker", "tiger", "mouse", "friend")
ADJECTIVES = ("big", "small", "red", "old", "young", "happy", "angry", "quiet", "brave", "tall",
              "clever", "lazy")
TRANSITIVE = ("see", "like", "follow", "help", "chase", "call", "find", "push", "watch", "meet")
INTRANSITIVE = ("sleep", "run", "sing", "laugh", "wait", "dance")
PLACES = ("house", "tree", "river", "bridge", "table", "garden", "market", "hill")
PREPOSITIONS = ("near", "under", "behind", "in", "on", "with")
DETERMINERS = ("the", "a")
# Every split the task can have; test_long_seen only where num_test_long_seen > 0.
SPLITS = ("train", "validation", "test", "test_long", "test_long_seen")
# A split of SPLITS that a config may not make -> what makes it (said when one is asked for).
MADE_BY = {"test_long_seen": "set task.synthetic.num_test_long_seen to make it"}
MIN_SENTENCE_WORDS = 3  # "the dog sleeps"

_SYLLABLES = tuple(c + v for c in "bdfgklmnprstvz" for v in "aeiou")


def _invented_lexicon() -> dict[str, str]:
  """English word -> invented target word (fixed: the language does not change with seeds)."""
  rng = random.Random(20180306)
  words = NOUNS + ADJECTIVES + TRANSITIVE + INTRANSITIVE + PLACES + PREPOSITIONS
  lexicon, used = {}, set()
  for word in words:
    while True:
      stem = "".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((1, 2, 2, 3))))
      if stem not in used:
        used.add(stem)
        lexicon[word] = stem
        break
  lexicon.update({"the": "na", "a": "ul", "and": "ke"})
  return lexicon


LEXICON = _invented_lexicon()
CASE_SUFFIX = {"subject": "a", "object": "o", "oblique": "e"}


@dataclasses.dataclass
class NounPhrase:
  """A noun phrase; `relative` is an optional subject relative clause (verb, object)."""
  determiner: str
  adjectives: list[str]
  noun: str
  plural: bool
  relative: tuple[str, "NounPhrase"] | None = None

  def source(self) -> list[str]:
    noun = self.noun + ("s" if self.plural else "")
    words = [self.determiner, *self.adjectives, noun]
    if self.relative:
      verb, obj = self.relative
      words += ["that", _english_verb(verb, self.plural), *obj.source()]
    return words

  def target(self, role: str) -> list[str]:
    noun = LEXICON[self.noun] + ("mi" if self.plural else "") + CASE_SUFFIX[role]
    words = [noun, *(LEXICON[a] for a in self.adjectives), LEXICON[self.determiner]]
    if self.relative:
      verb, obj = self.relative
      words = [*obj.target("object"), LEXICON[verb] + "ri", *words]
    return words


def _english_verb(verb: str, plural_subject: bool) -> str:
  return verb if plural_subject else verb + ("es" if verb.endswith(("ch", "sh")) else "s")


def _target_verb(verb: str, plural_subject: bool) -> str:
  return LEXICON[verb] + ("n" if plural_subject else "t")


@dataclasses.dataclass
class Clause:
  """subject verb [object] [preposition place-phrase]."""
  subject: NounPhrase
  verb: str
  obj: NounPhrase | None
  adjunct: tuple[str, NounPhrase] | None

  def source(self) -> list[str]:
    words = [*self.subject.source(), _english_verb(self.verb, self.subject.plural)]
    if self.obj:
      words += self.obj.source()
    if self.adjunct:
      words += [self.adjunct[0], *self.adjunct[1].source()]
    return words

  def target(self) -> list[str]:
    words = self.subject.target("subject")
    if self.obj:
      words += self.obj.target("object")
    if self.adjunct:
      words += [*self.adjunct[1].target("oblique"), LEXICON[self.adjunct[0]]]
    return words + [_target_verb(self.verb, self.subject.plural)]

  def swapped(self) -> "Clause":
    """Subject and object exchanged (same words when both have the same number)."""
    return dataclasses.replace(self, subject=self.obj, obj=self.subject)


def _noun_phrase(rng: random.Random, nouns=NOUNS, *, allow_relative: bool) -> NounPhrase:
  relative = None
  if allow_relative and rng.random() < 0.2:
    relative = (rng.choice(TRANSITIVE), _noun_phrase(rng, allow_relative=False))
  plural = rng.random() < 0.3
  determiner = "the" if plural else rng.choice(DETERMINERS)
  return NounPhrase(determiner, rng.sample(ADJECTIVES, rng.choice((0, 0, 1, 1, 2))),
                    rng.choice(nouns), plural, relative)


def _clause(rng: random.Random) -> Clause:
  subject = _noun_phrase(rng, allow_relative=True)
  if rng.random() < 0.7:
    verb, obj = rng.choice(TRANSITIVE), _noun_phrase(rng, allow_relative=True)
  else:
    verb, obj = rng.choice(INTRANSITIVE), None
  adjunct = None
  if rng.random() < 0.35:
    adjunct = (rng.choice(PREPOSITIONS), _noun_phrase(rng, PLACES, allow_relative=False))
  return Clause(subject, verb, obj, adjunct)


def _sentence(clauses: list[Clause]) -> tuple[str, str]:
  source, target = [], []
  for i, clause in enumerate(clauses):
    if i:
      source.append("and")
      target.append(LEXICON["and"])
    source += clause.source()
    target += clause.target()
  return " ".join(source), " ".join(target)


def clause_count(source: str) -> int:
  """The clauses of a generated source: `_sentence` joins them with "and", which the grammar
  uses nowhere else."""
  return source.split().count("and") + 1


def relative_clause_count(source: str) -> int:
  """The relative clauses of a generated source: "that" opens each, and only those."""
  return source.split().count("that")


# The constructions of a long sentence, by what training (at most 12 words) never holds: two
# clauses joined by "and" (at least 7 words), and one clause with two relative clauses (at
# least 13 words: "the dog that sees a cat likes the bird that sees a king").
SEEN_CONSTRUCTIONS = "seen constructions"
# The longest sentence of seen constructions: one clause whose noun phrases hold at most one
# relative clause (subject with it 10 words, verb 1, object 4, prepositional phrase 5).
SEEN_MAX_WORDS = 20
TWO_RELATIVE_CLAUSES = "2 relative clauses"
TWO_CLAUSES = "2 clauses"


def long_sentence_construction(source: str) -> str:
  """Which of the test_long subsets a generated source belongs to: TWO_CLAUSES,
  TWO_RELATIVE_CLAUSES (one clause holding two) or SEEN_CONSTRUCTIONS (one clause, at most one
  relative clause: every construction occurs in training, only the length is new)."""
  if clause_count(source) > 1:
    return TWO_CLAUSES
  return TWO_RELATIVE_CLAUSES if relative_clause_count(source) > 1 else SEEN_CONSTRUCTIONS


def subsets_of(split: str, pairs: Sequence[tuple[str, str]],
               train_pairs: set[tuple[str, str]]) -> list[tuple[str, list[int]]]:
  """What a held-out split holds, as (name, sentence indices) of `pairs`: for `test_long`, its
  sentences by `long_sentence_construction` (those of constructions seen in training test
  length alone; the others hold a construction never seen, besides their length), empty
  subsets left out; none for test_long_seen (all of it is SEEN_CONSTRUCTIONS); for the other
  splits, the pairs that also occur in training (`train_pairs`; the grammar repeats short
  sentences) and those that do not."""
  if split == "test_long_seen":
    return []
  if split != "test_long":
    seen = [pair in train_pairs for pair in pairs]
    return [("in training", [i for i, s in enumerate(seen) if s]),
            ("not in training", [i for i, s in enumerate(seen) if not s])]
  kinds = [long_sentence_construction(source) for source, _ in pairs]
  return [(kind, [i
                  for i, k in enumerate(kinds)
                  if k == kind])
          for kind in (SEEN_CONSTRUCTIONS, TWO_RELATIVE_CLAUSES, TWO_CLAUSES)
          if kind in kinds]


def generate(num: int, min_words: int, max_words: int, seed: int | str, *,
             swap_fraction: float = 0.0,
             keep: Callable[[str], bool] | None = None) -> list[tuple[str, str]]:
  """`num` (source, target) pairs with min_words..max_words source words.

  Args:
    num: number of pairs.
    min_words, max_words: inclusive source length range.
    seed: the generator's seed (same seed, same pairs).
    swap_fraction: probability that a one-clause transitive sentence is followed by its
      subject/object swap (a permutation of the same words with another target).
    keep: where given, only the sentences whose source it accepts are kept (the others are
      drawn and dropped, as those out of the length range are).
  """
  rng = random.Random(seed)
  clauses_needed = max(1, round(max_words / 12))
  pairs: list[tuple[str, str]] = []
  while len(pairs) < num:
    clauses = [_clause(rng) for _ in range(rng.randint(1, clauses_needed))]
    source, target = _sentence(clauses)
    if not min_words <= len(source.split()) <= max_words or (keep and not keep(source)):
      continue
    pairs.append((source, target))
    only = clauses[0]
    if (len(clauses) == 1 and only.obj is not None and only.obj.plural == only.subject.plural and
        len(pairs) < num and rng.random() < swap_fraction):
      pairs.append(_sentence([only.swapped()]))
  return pairs


def permutation_fraction(pairs: list[tuple[str, str]]) -> float:
  """Fraction of pairs whose source shares its bag of words with another pair's source
  while the targets differ."""
  by_bag: dict[tuple, set[str]] = {}
  bags = []
  for source, target in pairs:
    bag = tuple(sorted(Counter(source.split()).items()))
    bags.append(bag)
    by_bag.setdefault(bag, set()).add(target)
  return sum(len(by_bag[bag]) > 1 for bag in bags) / max(1, len(pairs))


@dataclasses.dataclass(frozen=True)
class SyntheticParams:
  """Sizes and length ranges of the generated splits (config.task.synthetic)."""
  seed: int = 1234
  num_train: int = 20000
  num_validation: int = 500
  num_test: int = 500
  num_test_long: int = 500
  num_test_long_seen: int = 0
  min_words: int = 3
  max_words: int = 12
  long_min_words: int = 13
  long_max_words: int = 24

  def __post_init__(self):
    """Raises ValueError for a length range the grammar cannot fill or an overlapping
    test_long range."""
    for low, high in (("min_words", "max_words"), ("long_min_words", "long_max_words")):
      if getattr(self, high) < max(getattr(self, low), MIN_SENTENCE_WORDS):
        raise ValueError(f"config field task.synthetic.{high}={getattr(self, high)} must be at "
                         f"least task.synthetic.{low}={getattr(self, low)} and at least "
                         f"{MIN_SENTENCE_WORDS} (the shortest sentence).")
    if self.long_min_words <= self.max_words:
      raise ValueError(f"config field task.synthetic.long_min_words={self.long_min_words} must "
                       f"exceed task.synthetic.max_words={self.max_words}: test_long holds "
                       f"sentences longer than any training sentence.")
    if self.num_test_long_seen and self.long_min_words > SEEN_MAX_WORDS:
      raise ValueError(f"config field task.synthetic.num_test_long_seen={self.num_test_long_seen} "
                       f"needs task.synthetic.long_min_words <= {SEEN_MAX_WORDS} (the longest "
                       f"sentence of seen constructions), not {self.long_min_words}.")

  @classmethod
  def of(cls, task_config: ml_collections.ConfigDict) -> "SyntheticParams":
    """The parameters of a synthetic task's config (its `task.synthetic`), checked."""
    return cls(**task_config.synthetic.to_dict())

  def fields(self) -> dict[str, int]:
    """The parameters; num_test_long_seen only where set (above 0), so that the parameters of a
    task without that split keep the name, and the data, they had before the split existed."""
    fields = dataclasses.asdict(self)
    if not self.num_test_long_seen:
      del fields["num_test_long_seen"]
    return fields

  def name(self) -> str:
    """A builder-config name unique to these parameters (a changed size never reuses data)."""
    digest = hashlib.sha1(json.dumps(self.fields(), sort_keys=True).encode())
    return f"p{digest.hexdigest()[:12]}"

  def split_names(self) -> tuple[str, ...]:
    """The splits these parameters make: SPLITS, test_long_seen only where asked for."""
    return tuple(s for s in SPLITS if s != "test_long_seen" or self.num_test_long_seen)

  def splits(self) -> dict[str, list[tuple[str, str]]]:
    """Every split's pairs, each from its own seed "<seed>/<split>" (no split of one seed
    repeats a split of another; adding test_long_seen changes no other split)."""
    short, long = (self.min_words, self.max_words), (self.long_min_words, self.long_max_words)
    splits = {
        "train": generate(self.num_train, *short, f"{self.seed}/train"),
        "validation": generate(self.num_validation, *short, f"{self.seed}/validation"),
        "test": generate(self.num_test, *short, f"{self.seed}/test", swap_fraction=0.5),
        "test_long": generate(self.num_test_long, *long, f"{self.seed}/test_long"),
    }
    if self.num_test_long_seen:
      seen = lambda source: long_sentence_construction(source) == SEEN_CONSTRUCTIONS
      splits["test_long_seen"] = generate(self.num_test_long_seen, *long,
                                          f"{self.seed}/test_long_seen", keep=seen)
    return splits


class SyntheticBuilderConfig(tfds.core.BuilderConfig):
  """Builder config carrying the generation parameters; its name is their hash."""
  def __init__(self, params: SyntheticParams):
    super().__init__(name=params.name(), description=json.dumps(params.fields()))
    self.params = params


class SyntheticTranslation(datasets.PairBuilder):
  """TFDS builder of the synthetic task; features {"source", "target"} (text).

  `info.metadata["test_permutation_fraction"]` holds `permutation_fraction` of the test split.
  """

  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {"1.1.0": "Each split from its own string seed; stored in generation order."}

  def _info(self) -> tfds.core.DatasetInfo:
    return datasets.pair_info(self, __doc__, metadata=tfds.core.MetadataDict())

  def _split_generators(self, dl_manager) -> dict[str, Iterator]:
    del dl_manager  # generated, nothing to download
    splits = self.builder_config.params.splits()
    fraction = permutation_fraction(splits["test"])
    self.info.metadata["test_permutation_fraction"] = fraction
    logging.info(
        "Synthetic test split: %.1f%% of its sources are word-order permutations of "
        "another test source with a different target.", 100 * fraction)
    return {name: self._generate_examples(pairs) for name, pairs in splits.items()}


def load(task_config: ml_collections.ConfigDict, root: str) -> datasets.PairDataset:
  """The synthetic dataset of `task_config.synthetic`, generated into `root` on first use."""
  params = SyntheticParams.of(task_config)
  builder = datasets.prepared(
      lambda: SyntheticTranslation(config=SyntheticBuilderConfig(params), data_dir=root, file_format
                                   =datasets.FILE_FORMAT), datasets.prepare)
  return datasets.PairDataset(builder, params.split_names())
