"""Multi30K (EN-DE, about 29k training pairs): a small Transformer sized for one GPU.

3 + 3 layers of width 256 with 4 heads and more dropout than the base model, since the
corpus is small. Launch: `python train.py --config=configs/multi30k.py --workdir=runs/m30k`.
"""
import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  """Returns the Multi30K configuration (relative positions, k = 16)."""
  config = default.get_config()
  config.task.name = "multi30k"
  config.task.vocab_size = 8000
  config.task.max_length = 64

  model = config.model
  model.emb_dim = 256
  model.num_heads = 4
  model.qkv_dim = 256
  model.mlp_dim = 1024
  model.num_encoder_layers = 3
  model.num_decoder_layers = 3
  model.dropout_rate = 0.2

  train = config.train
  train.batch_size = 128
  train.num_steps = 15000
  train.learning_rate = 0.001
  train.warmup_steps = 2000
  train.log_every_steps = 100
  train.eval_every_steps = 1000
  train.checkpoint_every_steps = 1000
  train.keep_checkpoints = 3
  return config
