"""Position variants, one module each, found by name through a registry.

  none      no position information
  absolute  encodings of each token's position added to the embeddings (Vaswani et al. 2017)
  relative  Shaw et al. (2018) tables a^K / a^V in self-attention
  t5        one learned scalar per head per logarithmic bucket (Raffel et al. 2020)
  rope      rotary embeddings of queries and keys (Su et al. 2021)
  alibi     a linear distance bias per head (Press et al. 2022)
  fire      a learned function of the normalized log distance (Li et al. 2023)
  shape     sinusoidal encodings shifted by a random offset in training (Kiyono et al. 2021)
  randomized  sinusoidal encodings of sorted random positions in training (Ruoss et al. 2023)

`interface` says what a variant is; a new one is a module of its own that registers a
`Variant` subclass (README: "Adding a position variant"). Importing this package registers the
built-in ones.
"""
from relpos.variants.interface import AttentionPosition, AttentionTerms, StochasticEmbedding
from relpos.variants.interface import Variant
from relpos.variants.interface import all_fields, get, names, origin, owner, register
# Importing a built-in variant registers it; the order is the order of `names()`.
# pylint: disable-next=g-bad-import-order,wrong-import-position
from relpos.variants import none, absolute, relative, t5, rope, alibi, fire, shape, randomized  # noqa: F401,E501

# The variants of relpos itself (tested by its tests); any other is a user's, tried before use.
BUILT_IN: tuple[str, ...] = names()

__all__ = [
    "AttentionPosition", "AttentionTerms", "BUILT_IN", "StochasticEmbedding", "Variant",
    "all_fields", "get", "names", "origin", "owner", "register"
]
