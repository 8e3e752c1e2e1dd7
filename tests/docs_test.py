"""The recipe in docs/analyses.md works as written: its analysis against NumPy."""

import os
import re
import sys
import types

import numpy as np
import pytest

from papa_jax.analysis import per_head
from tests.testing import analysis_means, sst2_dev_sample

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def recipe():
  """The namespace of the recipe's code block, run as written, as the module
  `papa_jax.analysis.entropy` would be (dataclasses resolve `ClassVar` in its module)."""
  text = open(os.path.join(ROOT, "docs", "analyses.md"), encoding="utf-8").read()
  block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "class Entropy" in b)
  module = types.ModuleType("docs_entropy_recipe")
  sys.modules[module.__name__] = module
  exec(compile(block, "docs/analyses.md", "exec"), module.__dict__)  # pylint: disable=exec-used
  return module.__dict__


@pytest.mark.parametrize("devices", [1, 8])
def test_docs_analysis_recipe_equals_numpy(minilm, minilm_tokenizer, sst2_dir, devices):
  ns = recipe()
  assert ns["STAGE"].name == "entropy" and ns["STAGE"].writes == ("entropy/stats.json",)
  assert ns["STAGE"].groups == per_head.ANALYSIS_GROUPS
  data = sst2_dev_sample(minilm_tokenizer, sst2_dir, longest=3, first=6, max_length=40)
  st = analysis_means(ns["Entropy"](), minilm, data.arrays(), devices=devices, batch_size=8)
  assert st["count"] == 9
  out = minilm.apply(data.input_ids, data.attention_mask, capture_attention=True)
  want = np.zeros((6, 12))
  for b in range(len(data)):
    real = data.attention_mask[b].astype(bool)
    for l, a in enumerate(out.attentions):
      p = np.asarray(a, np.float64)[b][:, real][:, :, real]  # [H, n, n]
      want[l] += -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), -1).mean(-1)
  np.testing.assert_allclose(st["entropy"], want / len(data), rtol=1e-5)
