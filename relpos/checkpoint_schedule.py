"""Which checkpoints a run saves on schedule, and which of them it keeps.

Training saves a checkpoint every `train.checkpoint_every_steps` and `train.eval_every_steps`
steps and at `train.num_steps`, whether or not it is interrupted; a stop (SIGTERM, Ctrl-C)
saves one in between, so that the run resumes where it stopped. `average:N` averages the last N
saved on schedule, so that a resumed run's average is that of the run never stopped; for it,
the manager keeps the last `train.keep_checkpoints` saved on schedule, however many stops saved
checkpoints in between, and the newest checkpoint of any kind (to resume from).
"""
import dataclasses
import math
from collections.abc import Callable, Sequence

import ml_collections
from orbax.checkpoint import checkpoint_managers


def on_schedule(step: int, train_config: ml_collections.ConfigDict) -> bool:
  """Whether training saves `step` whether or not it is interrupted."""
  return (step % train_config.checkpoint_every_steps == 0 or
          step % train_config.eval_every_steps == 0 or step == train_config.num_steps)


def scheduled_steps(steps: Sequence[int], train_config: ml_collections.ConfigDict) -> list[int]:
  """The steps of `steps` saved on schedule (`on_schedule`), in order: a checkpoint saved on
  SIGTERM in between is left out."""
  return sorted(s for s in steps if on_schedule(s, train_config))


def count_on_schedule(train_config: ml_collections.ConfigDict) -> int:
  """How many checkpoints a run of train.num_steps saves on schedule (counted, not listed:
  a config is validated often, and num_steps may be in the millions)."""
  steps = train_config.num_steps
  every, evaluations = train_config.checkpoint_every_steps, train_config.eval_every_steps
  both = math.lcm(every, evaluations)
  last = 0 if steps % every == 0 or steps % evaluations == 0 else 1
  return steps // every + steps // evaluations - steps // both + last


@dataclasses.dataclass
class LatestOnSchedule(checkpoint_managers.PreservationPolicy):
  """An Orbax preservation policy: the last `n` checkpoints saved on schedule, and the newest.

  Orbax's `LatestN` counts a checkpoint saved on a stop too, so after one stop the last N
  scheduled checkpoints were no longer all kept and `average:N` could never be computed.

  Attributes:
    n: how many checkpoints saved on schedule to keep.
    scheduled: whether a step is saved on schedule (`on_schedule` of the run's config).
  """
  n: int
  scheduled: Callable[[int], bool]

  def should_preserve(self, checkpoints: Sequence[checkpoint_managers.PolicyCheckpointInfo], *,
                      context: checkpoint_managers.PreservationContext) -> Sequence[bool]:
    del context
    steps = sorted(c.step for c in checkpoints)
    kept = set([s for s in steps if self.scheduled(s)][-self.n:] + steps[-1:])
    return [c.step in kept for c in checkpoints]
