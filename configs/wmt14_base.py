"""WMT 2014 EN-DE with the base model of Shaw et al. (2018) (tensor2tensor `transformer_base`).

6 + 6 layers, model width 512, feed-forward 2048, 8 heads, relative positions with k = 16
in self-attention only, dropout and label smoothing 0.1, Adam (0.9, 0.98, 1e-9) with 4,000
warm-up steps then inverse square root decay, 100k steps, beam 4 with alpha 0.6. A batch
holds 96 packed sequences of 256 tokens (about 25k tokens per side, as in the paper).
The peak learning rate is the paper's d_model^-0.5 * warmup^-0.5 = 512^-0.5 * 4000^-0.5.
"""
import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  """Returns the WMT14 base configuration."""
  config = default.get_config()
  config.task.name = "wmt14"
  config.task.vocab_size = 32000
  config.task.max_length = 256

  model = config.model
  model.emb_dim = 512
  model.num_heads = 8
  model.qkv_dim = 512
  model.mlp_dim = 2048
  model.num_encoder_layers = 6
  model.num_decoder_layers = 6
  model.dropout_rate = 0.1
  model.max_len = 512
  model.max_relative_position = 16

  train = config.train
  train.batch_size = 96
  train.num_steps = 100_000
  train.learning_rate = 512**-0.5 * 4000**-0.5
  train.warmup_steps = 4000
  train.log_every_steps = 100
  train.eval_every_steps = 5000
  train.checkpoint_every_steps = 5000
  train.keep_checkpoints = 3
  return config
