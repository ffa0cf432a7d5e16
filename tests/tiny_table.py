"""A tiny table's settings, shared by the runner's and the children's tests."""


def overrides(data_dir: str) -> dict[str, object]:
  """A table's `--set` overrides for runs of a few seconds on the synthetic task, its data
  generated in `data_dir`."""
  return {
      "task.tfds_data_dir": data_dir,
      "task.vocab_size": 64,
      "task.synthetic.num_train": 200,
      "task.synthetic.num_validation": 8,
      "task.synthetic.num_test": 8,
      "task.synthetic.num_test_long": 8,
      "model.emb_dim": 16,
      "model.qkv_dim": 16,
      "model.mlp_dim": 32,
      "model.num_heads": 2,
      "model.num_encoder_layers": 1,
      "model.num_decoder_layers": 1,
      "train.num_steps": 4,
      "train.batch_size": 8,
      "train.eval_batch_size": 8,
      "train.log_every_steps": 2,
      "train.eval_every_steps": 4,
      "train.checkpoint_every_steps": 4,
      "train.warmup_steps": 2,
      "decode.other_checkpoints": "latest",
  }
