"""Shared pytest setup: tests run on CPU with 4 host devices for multi-device checks, and what
they prepare without naming a data folder goes to a temporary one, never ~/tensorflow_datasets.

Set JAX_PLATFORMS (e.g. to "" or "cuda") to run on an accelerator instead: tests/test_gpu.py.
"""
import json
import os
import sys
from collections.abc import Callable

import pytest

# XLA's CPU backend without LLVM's optimizations: the tests' programs are small and most run a
# few times, so compiling costs more than running (tests/test_kernels.py and test_model.py on 2
# cores: 156 s -> 135 s). Child processes given their own device count keep it (`xla_flags`):
# their programs compare bitwise with this process's.
FAST_COMPILE = "--xla_backend_optimization_level=0"
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=4 {FAST_COMPILE}")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# As every program of relpos does at start-up (`relpos.cli`): a run trained in this process then
# compiles as one trained by train.py in a child process, and their parameters compare bitwise
# whatever ran before (tests/test_reliability.py).
from relpos import prng  # pylint: disable=wrong-import-position

prng.lower_threefry_unrolled_on_cpu()


@pytest.fixture(autouse=True, scope="session")
def failed_read_leftovers_dropped():
  """As every program of relpos does at start-up (`relpos.cli.drop_failed_read_leftovers`): the
  reads Orbax leaves behind when a test reads a damaged checkpoint are not reported, each with
  its tensorstore spec, as unraisable exceptions of whichever test runs when they are collected.
  """
  from relpos import cli  # pylint: disable=import-outside-toplevel
  previous = sys.unraisablehook
  cli.drop_failed_read_leftovers()
  yield
  sys.unraisablehook = previous


@pytest.fixture(autouse=True, scope="session")
def default_data_dir(tmp_path_factory: pytest.TempPathFactory):
  """RELPOS_DATA_DIR (the data folder of a config that names none) for the whole session, in
  this process and the programs the tests start: a folder under pytest's temporary one."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("RELPOS_DATA_DIR", str(tmp_path_factory.mktemp("default_data_dir")))
    yield


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
  """The TFDS data folder of the tests' runs (the synthetic task prepared once a session)."""
  return str(tmp_path_factory.getbasetemp() / "relpos_data")


@pytest.fixture(autouse=True, scope="session")
def compilation_cache(tmp_path_factory: pytest.TempPathFactory):
  """JAX's persistent compilation cache in a folder of this test run, for this process, the
  other workers of `pytest -n` and the programs the tests start: a program compiled once (the
  tiny config's train step, trained by many tests in this process and in child runs) is
  loaded, not compiled, the next time. The same programs: the same results, bitwise. (An entry
  read while another process writes it fails to load and is compiled again: jax warns.)"""
  import jax  # pylint: disable=import-outside-toplevel
  run_folder = tmp_path_factory.getbasetemp()
  if "PYTEST_XDIST_WORKER" in os.environ:
    run_folder = run_folder.parent  # the workers' folders lie in the run's
  path = str(run_folder / "jax_cache")
  os.makedirs(path, exist_ok=True)
  before = (jax.config.jax_compilation_cache_dir,
            jax.config.jax_persistent_cache_min_compile_time_secs)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("JAX_COMPILATION_CACHE_DIR", path)
    patch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    yield
  jax.config.update("jax_compilation_cache_dir", before[0])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])


@pytest.fixture(scope="session")
def environment(compilation_cache) -> dict[str, str]:  # pylint: disable=unused-argument,redefined-outer-name
  """Environment of the training processes tests start (with the test run's compilation cache:
  `compilation_cache`)."""
  return dict(os.environ)


@pytest.fixture(scope="session")
def xla_flags() -> Callable[[int], str]:
  """XLA_FLAGS of a child process with `count` CPU devices, compiled as the tests' programs."""
  return lambda count: f"--xla_force_host_platform_device_count={count} {FAST_COMPILE}"


@pytest.fixture(scope="session")
def reference(data_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
  """Workdir of the uninterrupted run tests/kill_run.py describes (tests copy it to change it)."""
  import kill_run  # pylint: disable=import-outside-toplevel
  from relpos import train  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path_factory.mktemp("reference"))
  train.train_and_evaluate(kill_run.make_config(data_dir, kill_run.KILL_RUN), workdir)
  return workdir


# A run that translates: the synthetic task with the default model's width, trained 400 steps,
# evaluated (beam 2) every 100; its validation BLEU rises to about 12 (the tiny config's 12
# steps translate every sentence as an empty string, BLEU 0.0, which no comparison can fail
# on). Its checkpoints are 300 and 400.
TRANSLATING_RUN = {
    "model.emb_dim": 64, "model.qkv_dim": 64, "model.mlp_dim": 128, "model.num_heads": 4,
    "task.synthetic.num_train": 2000, "train.batch_size": 32, "train.num_steps": 400,
    "train.learning_rate": 0.01, "train.warmup_steps": 50, "train.log_every_steps": 100,
    "train.eval_every_steps": 100, "train.checkpoint_every_steps": 100
}


@pytest.fixture(scope="session")
def translating_run(tmp_path_factory: pytest.TempPathFactory):
  """(config, workdir, validation records by step) of TRANSLATING_RUN, trained once for every
  test module that compares translations or scores. Tests copy the workdir before changing it.
  """
  from configs import tiny  # pylint: disable=import-outside-toplevel
  from relpos import metrics_writer, train  # pylint: disable=import-outside-toplevel
  config = tiny.get_config()
  config.task.tfds_data_dir = str(tmp_path_factory.getbasetemp() / "relpos_data")
  for path, value in TRANSLATING_RUN.items():
    *sections, name = path.split(".")
    node = config
    for section in sections:
      node = node[section]
    node[name] = value
  workdir = str(tmp_path_factory.mktemp("translating_run"))
  train.train_and_evaluate(config, workdir)
  validation = {
      r["step"]: r for r in metrics_writer.read_metrics(workdir) if r["split"] == "validation"
  }
  assert min(r["bleu"] for s, r in validation.items() if s >= 300) > 3.0, validation
  return config, workdir, validation


@pytest.fixture
def results_path(tmp_path):
  """A results.json of `fake_results.few_seeds()`."""
  import fake_results  # pylint: disable=import-outside-toplevel
  path = tmp_path / "results.json"
  path.write_text(json.dumps({"runs": fake_results.few_seeds()}))
  return path


@pytest.fixture
def figures(monkeypatch):
  """Figure name -> the matplotlib figure a plot function made (not written)."""
  from relpos.experiments import plots  # pylint: disable=import-outside-toplevel
  made = {}

  def keep(fig, path):
    made[os.path.basename(path)] = fig
    return path

  monkeypatch.setattr(plots, "save", keep)
  yield made
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  for fig in made.values():  # the test has read them: free them, as `save` would have
    plt.close(fig)


@pytest.fixture(scope="session")
def tiny_model():
  """A Transformer of the default config, 2 + 1 layers of width 16, a vocabulary of 16, k = 2."""
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from configs import default  # pylint: disable=import-outside-toplevel
  from relpos import model as model_lib, model_config  # pylint: disable=import-outside-toplevel
  model_cfg = {
      **default.get_config().model.to_dict(), "emb_dim": 16, "num_heads": 2, "qkv_dim": 16,
      "mlp_dim": 32, "num_encoder_layers": 2, "num_decoder_layers": 1, "max_len": 32,
      "max_relative_position": 2
  }
  return model_lib.Transformer(model_config.TransformerConfig.from_config(model_cfg, 16),
                               rngs=nnx.Rngs(0))


@pytest.fixture
def variant_registry(monkeypatch):
  """The position variants registered during a test are forgotten after it."""
  from relpos.variants import interface  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(interface, "_REGISTRY", dict(interface._REGISTRY))  # pylint: disable=protected-access
