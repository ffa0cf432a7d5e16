"""The Transformer's config: one typed attribute per `model.*` field, and its rules.

`TransformerConfig` declares the architecture's fields (default, rule, doc beside each
attribute) and carries the options of the position variant `position` selects; `from_config`
builds it from `config.model`, checking every field. The rules cuDNN's fused attention sets a
model are checked here, at the config's edge (`check_cudnn`), in the words of its fields.
"""
import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from absl import logging

from relpos import fields
from relpos import user_modules
from relpos import variants
from relpos.kernels import fused
from relpos.kernels import relative as kernel

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _field(default: Any, rule: fields.Rule, doc: str, **kwargs: Any) -> Any:
  """A TransformerConfig attribute declared as the config field `model.<its name>`."""
  return dataclasses.field(default=default,
                           metadata={"field": fields.Field(default, rule, doc, **kwargs)})


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """The architecture of the Transformer: one typed attribute per `model.*` field (its default,
  rule and doc beside it), the task's vocabulary size, and the options of the position variant
  that `position` selects.

  Build it with `from_config`, which checks every field; a variant reads its own options as
  attributes too (`config.max_relative_position`), or from `options`.

  Raises:
    ValueError: naming the first invalid field (as config field model.<name>), its value and
      the allowed values.
  """
  vocab_size: int
  emb_dim: int = _field(64, fields.integer(1), "embedding and model width")
  num_heads: int = _field(4, fields.integer(1), "attention heads")
  qkv_dim: int = _field(64, fields.integer(1), "query/key/value width over all heads")
  mlp_dim: int = _field(128, fields.integer(1), "feed-forward hidden width")
  num_encoder_layers: int = _field(2, fields.integer(1), "encoder layers")
  num_decoder_layers: int = _field(2, fields.integer(1), "decoder layers")
  dropout_rate: float = _field(0.1, fields.number(0.0, 1.0, open_max=True),
                               "dropout of embeddings and sublayer outputs")
  attention_dropout_rate: float = _field(0.0, fields.number(0.0, 1.0, open_max=True),
                                         "dropout of attention weights")
  pre_layer_norm: bool = _field(True, fields.BOOLEAN, "pre-LN (True) or post-LN residuals")
  share_embeddings: bool = _field(True, fields.BOOLEAN,
                                  "one embedding for source and target (shared vocabulary)")
  logits_via_embedding: bool = _field(True, fields.BOOLEAN,
                                      "output logits through the target embedding")
  max_len: int = _field(256, fields.integer(1),
                        "longest sequence (learned absolute tables, decode cache)")
  position: str = _field("relative", fields.NON_EMPTY_STRING,
                         "the position variant: a name of relpos.variants.names()")
  dtype: str = _field("float32", fields.one_of(*DTYPES),
                      "compute dtype of activations, matmuls and the decode cache")
  attention_implementation: str = _field(
      "auto", fields.one_of(*kernel.IMPLEMENTATIONS),
      "attention kernel: auto (cuDNN where it can run, else XLA) | xla | cudnn",
      effect=fields.RESULT)  # the same function computed another way: free on resume
  # (name, value) of each field of the selected variant (`variants.get(position).fields`).
  options: tuple[tuple[str, Any], ...] = ()

  def __post_init__(self):
    if self.qkv_dim % self.num_heads:
      raise fields.invalid("model.num_heads", self.num_heads,
                           f"a divisor of model.qkv_dim={self.qkv_dim}")
    _check_variant(variants.get(self.position), self)
    if self.attention_implementation == "cudnn":
      check_cudnn(self)

  def __getattr__(self, name: str) -> Any:
    """A field of the selected variant, read as an attribute (`config.rope_base`)."""
    options = dict(self.__dict__.get("options", ()))
    if name in options:
      return options[name]
    raise AttributeError(f"TransformerConfig has no field {name!r} (model.position="
                         f"{self.__dict__.get('position')!r}).")

  @property
  def head_dim(self) -> int:
    """Per-head depth qkv_dim // num_heads."""
    return self.qkv_dim // self.num_heads

  @property
  def compute_dtype(self) -> Any:
    """The jnp dtype of `dtype`."""
    return DTYPES[self.dtype]

  def to_dict(self) -> dict[str, Any]:
    """`config.model` of this config: every architecture field, then the variant's options
    (vocab_size is the task's)."""
    return {**{name: getattr(self, name) for name in FIELDS}, **dict(self.options)}

  @classmethod
  def from_config(cls, model_cfg: Mapping[str, Any] | ml_collections.ConfigDict,
                  vocab_size: int) -> "TransformerConfig":
    """Builds the config from `config.model` (or a dict of its fields) and the vocabulary size.

    The architecture's fields and those of the variant `position` selects are checked; the
    fields of the other registered variants (a config holds them all, so that the command line
    can set them) are left out, logged for one set off its default (a base config's k under
    another variant). A missing field takes its value for configs written before it
    existed, with a warning; for a variant of the user's, one that also names the other cause
    (a config built in Python before the variant's module was imported).

    Raises:
      ValueError: an unknown field or an invalid value, naming it.
    """
    given = {name: model_cfg[name] for name in model_cfg.keys()}
    position = given.get("position", FIELDS["position"].value_when_absent)
    _check_position_name(position)
    own = variants.get(position).fields
    for name, field in variant_fields().items():
      if name in given and name not in own:
        if given[name] != field.default:
          logging.info(
              "config field model.%s=%r is left out: it is a field of position "
              "variant %r, and model.position=%r.", name, given[name], variants.owner(name),
              position)
        del given[name]
    if position not in variants.BUILT_IN:
      for name in [name for name in own if name not in given]:
        given[name] = own[name].value_when_absent
        logging.warning(
            "config field model.%s of position variant %r (%s) is missing: the config was built "
            "before that module was imported, or written before the field existed; using %r.", name,
            position,
            variants.get(position).__module__, given[name])
    values = fields.resolve(
        given, {**FIELDS, **own}, "model",
        hint=" A field of your own variant? --import=<its module> registers it.")
    return cls(vocab_size=vocab_size, **{name: values[name] for name in FIELDS}, options=tuple(
        (name, values[name]) for name in own))


# The architecture's `model.*` fields, in order (each position variant adds its own).
FIELDS: dict[str, fields.Field] = {
    f.name: f.metadata["field"]
    for f in dataclasses.fields(TransformerConfig)
    if "field" in f.metadata
}


def check_fields_used(overrides: Mapping[str, Any], positions: Sequence[str], flag: str) -> None:
  """Refuses an override of a variant's field that none of the `positions` run has: it would
  change nothing (`TransformerConfig.from_config` leaves the fields of other variants out),
  e.g. `--config.model.max_relative_position=8` with `model.position=rope`.

  Args:
    overrides: `model.*` field name -> the value given.
    positions: the position variants the override applies to (a run's, or a table's rows').
    flag: how the override was written, before the field's name ("--config.model.").

  Raises:
    ValueError: naming the override, the variants that have the field and those run.
  """
  if any(p not in variants.names() for p in positions):
    return  # validation names the unknown variant (and --import)
  declared = variant_fields()
  runs = [variants.get(p) for p in dict.fromkeys(positions)]
  for name, value in overrides.items():
    if name not in declared or any(name in variant.fields for variant in runs):
      continue
    owners = ", ".join(repr(v) for v in variants.names() if name in variants.get(v).fields)
    used = ", ".join(f"{v.name!r} ({'fields: ' + ', '.join(v.fields) if v.fields else 'no fields'})"
                     for v in runs)
    run = "model.position=" if len(runs) == 1 else "the rows' variants "
    raise ValueError(f"{flag}{name}={value!r}: a field of position variant {owners}, not of "
                     f"{run}{used}: it would change nothing.")


def default_config() -> ml_collections.ConfigDict:
  """`config.model` with every architecture field and every registered variant's at its
  default (so that the command line can set any of them; validation keeps the selected
  variant's)."""
  return ml_collections.ConfigDict(
      {name: field.default for name, field in {**FIELDS, **variant_fields()}.items()})


def _check_variant(variant: type[variants.Variant], config: TransformerConfig) -> None:
  """`variant.check(config)`; any error of a user's variant other than the ValueError it is to
  raise is named in one line, with the variant and its file."""
  try:
    variant.check(config)
  except ValueError:
    raise
  except Exception as e:
    if variant.name in variants.BUILT_IN:
      raise
    raise ValueError(f"position variant {variant.name!r} ({variants.origin(variant)}): its "
                     f"check(config) failed ({type(e).__name__}: {e}); check is a classmethod "
                     f"that raises ValueError for a config it refuses.") from e


def variant_fields() -> dict[str, fields.Field]:
  """The `model.*` fields of every registered variant (`variants.all_fields`).

  Raises:
    ValueError: a variant declares a field named like one of the architecture's or an
      attribute of TransformerConfig (`num_heads`, `head_dim`): it would change the default of
      every run, or read back the architecture's value.
  """
  found = variants.all_fields()
  reserved = set(FIELDS) | {f.name for f in dataclasses.fields(TransformerConfig)}
  for name in found:
    if name in reserved or hasattr(TransformerConfig, name):
      variant = variants.get(variants.owner(name))
      raise ValueError(f"position variant {variant.name!r} ({variants.origin(variant)}) declares "
                       f"field model.{name}, which is the Transformer's own; give it a name of "
                       f"the variant's (e.g. {variant.name}_{name}).")
  return found


def _check_position_name(position: Any) -> None:
  """Raises `fields.invalid` for model.position unless it names a registered variant, with the
  name meant (a typo) or how a variant of one's own is registered."""
  if isinstance(position, str) and position in variants.names():
    return
  allowed = f"one of {', '.join(map(repr, variants.names()))}"
  if isinstance(position, str):  # a typo, not any name that shares letters
    meant = difflib.get_close_matches(position, variants.names(), n=1, cutoff=0.8)
    allowed += f"; did you mean {meant[0]!r}?" if meant else ""
  imported = user_modules.imported()
  if imported:
    allowed += (f" ({', '.join(imported)} registered no variant {position!r}: is its class "
                f"decorated with @relpos.variants.register({position!r})?)")
  else:
    allowed += " (a variant of your own: --import=<its module>)"
  raise fields.invalid("model.position", position, allowed)


def check_cudnn(config: TransformerConfig) -> None:
  """What cuDNN's fused attention needs of the whole model, in the words of its fields: the
  conditions are `relpos.kernels.fused.cudnn_requirement`'s (lengths are checked per call).

  Raises:
    ValueError: naming the field that keeps cuDNN from running.
  """
  value_table = variants.get(config.position).value_table_field(config)
  need = fused.cudnn_requirement(backend=jax.default_backend(), dtypes=(config.compute_dtype,),
                                 depth=config.head_dim, value_table=value_table is not None,
                                 dropout=config.attention_dropout_rate > 0)
  if need is not None:
    requirement, reason = need
    name = {
        "backend": "attention_implementation", "dtype": "dtype", "value_table": value_table,
        "dropout": "attention_dropout_rate", "depth": "qkv_dim"
    }[requirement]
    value = "cudnn" if requirement == "backend" else getattr(config, name)
    raise ValueError(f"config field model.{name}={value!r} is invalid under "
                     f"model.attention_implementation='cudnn': {reason} (or use 'auto', which "
                     f"falls back to XLA).")
