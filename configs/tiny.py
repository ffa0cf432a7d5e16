"""A tiny run of the synthetic task (seconds on a CPU): for tests and smoke checks.

`python train.py --config=configs/tiny.py --workdir=/tmp/tiny`; a model of width 16 with one
encoder and one decoder layer, a few hundred training sentences, a few dozen steps.
"""
import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  """Returns the tiny configuration."""
  config = default.get_config()
  task = config.task
  task.vocab_size = 64
  task.max_length = 32
  task.synthetic.update(num_train=256, num_validation=16, num_test=16, num_test_long=8)

  model = config.model
  model.update(emb_dim=16, num_heads=2, qkv_dim=16, mlp_dim=32, num_encoder_layers=1,
               num_decoder_layers=1, max_len=64, max_relative_position=4)

  config.train.update(batch_size=8, num_steps=12, warmup_steps=4, log_every_steps=2,
                      eval_every_steps=6, checkpoint_every_steps=4, keep_checkpoints=2,
                      eval_batch_size=16)
  config.decode.beam_size = 2
  return config
