"""Default config: the synthetic translation task with a small model sized for 2 CPU cores.

Every field below can be overridden on the command line, e.g.
`--config.model.max_relative_position=8`. Validation happens once at start
(`relpos.config_validation.validate`), naming the field and the allowed values.
"""
import ml_collections

from relpos import model as model_lib


def get_config() -> ml_collections.ConfigDict:
  """Returns the default (synthetic task, CPU-sized, `rel_kv`) configuration."""
  config = ml_collections.ConfigDict()
  config.seed = 0

  # --- data -----------------------------------------------------------------
  task = config.task = ml_collections.ConfigDict()
  task.name = "synthetic"  # synthetic | multi30k | wmt14
  task.tfds_data_dir = ""  # "" -> $RELPOS_DATA_DIR or ~/tensorflow_datasets
  task.source_lang = "en"
  task.target_lang = "de"
  task.manual_dir = ""  # multi30k: folder holding the raw .gz files
  task.download_url = ""  # multi30k: URL base for downloads ("" -> public repo)
  task.vocab_size = 256  # SentencePiece vocabulary (source and target shared)
  task.spm_model_type = "unigram"  # unigram | bpe | word | char
  task.spm_seed = 0  # tokenizer training sample (only above 2M sentences)
  task.max_length = 48  # training: tokens per sequence (filter or truncate)
  task.overlong = "filter"  # filter | truncate (training only; eval never drops)
  task.packing = True  # True: pack examples; False: length bucketing
  task.shuffle_buffer_seed = 0  # folded with config.seed into the shuffle seed
  # Training only: probability that an example is joined with a random other one (sentence
  # concatenation, Kondo et al. 2021); 0.0 = off, the batches of before the option existed.
  task.concat_probability = 0.0
  synthetic = task.synthetic = ml_collections.ConfigDict()
  synthetic.seed = 1234
  synthetic.num_train = 20000
  synthetic.num_validation = 500
  synthetic.num_test = 500
  synthetic.num_test_long = 500
  synthetic.min_words = 3  # train/validation/test source length range (words)
  synthetic.max_words = 12
  synthetic.long_min_words = 13  # test_long source length range (words)
  synthetic.long_max_words = 24

  # --- model ----------------------------------------------------------------
  # Every model.* field at its default; each field's default, rule and meaning are declared
  # once: the architecture's in relpos/model.py (FIELDS), each position variant's own (k,
  # a^K / a^V switches, T5 buckets, ...) in its module of relpos/variants/. The default
  # variant is model.position = "relative" (Shaw et al., k = 16, a^K and a^V).
  config.model = model_lib.default_config()

  # --- training -------------------------------------------------------------
  train = config.train = ml_collections.ConfigDict()
  train.batch_size = 32  # global, sequences of task.max_length tokens
  # Gradient accumulated over this many micro-batches of batch_size / N rows (a global batch
  # larger than fits in memory); batch_size must divide by it times the device count.
  train.grad_accumulation_steps = 1
  train.num_steps = 1000
  train.learning_rate = 0.002  # peak, reached after warmup_steps
  train.warmup_steps = 150
  train.adam_b1 = 0.9
  train.adam_b2 = 0.98
  train.adam_eps = 1e-9
  train.weight_decay = 0.0
  train.label_smoothing = 0.1
  train.grad_clip_norm = 0.0  # 0: no clipping
  train.nonfinite = "raise"  # raise | skip
  train.max_skipped_fraction = 0.01  # skip: stop once more of num_steps' updates were skipped
  train.log_every_steps = 50
  train.eval_every_steps = 500
  # Stop after this many evaluations without a better validation BLEU (loss without BLEU);
  # 0: train all num_steps.
  train.early_stopping_patience = 0
  train.checkpoint_every_steps = 500
  train.keep_checkpoints = 2
  train.eval_batch_size = 64

  # --- decoding -------------------------------------------------------------
  decode = config.decode = ml_collections.ConfigDict()
  decode.beam_size = 4
  decode.alpha = 0.6
  decode.max_decode_len = 0  # 0 -> 2 * source length + 10, capped at model.max_len
  decode.validation_bleu = True  # beam-search BLEU at each periodic evaluation
  # The checkpoint the tables score: best (by validation BLEU) | latest | average:<N> (the
  # parameters of the last N saved checkpoints averaged; keep train.keep_checkpoints >= N).
  decode.checkpoint = "best"
  # Other checkpoint choices a table scores beside decode.checkpoint, comma-separated (e.g.
  # "average:10,latest"); "" for none.
  decode.other_checkpoints = ""
  # A table run's length diagnostics (relpos.experiments.diagnostics: length ratio, oracle-length
  # BLEU, token accuracy by position, encoder attention on long sources).
  decode.length_diagnostics = True
  return config
