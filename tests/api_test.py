"""The notebook API: the snippets of the README and docs/context_mixing.md run as written;
results load back."""

import os
import re

import numpy as np
import pytest

import papa_jax as pj
from papa_jax.papa import means as means_lib

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("path, section, printed", [
    ("README.md", "## Quick example", "(6, 12, 32, 32) (4, 32, 384) (4, 12, 32, 32)"),
    ("docs/context_mixing.md", "# Context mixing beyond attention",
     "(2, 6, 16, 16) (2, 6, 16, 16)")])
def test_api_readme_snippet_runs_as_written(minilm, capsys, path, section, printed):
  """The first python block after `section` in `path` runs and prints what it says."""
  del minilm
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    text = f.read()
  code = re.search(r"```python\n(.*?)```", text[text.index(section):], re.S).group(1)
  assert printed in code, f"{path}: the snippet no longer shows what it prints"
  exec(compile(code, path, "exec"), {})  # pylint: disable=exec-used
  assert capsys.readouterr().out.strip() == printed


def test_api_attention_means_equals_the_means_pass(minilm):
  data = pj.encode_texts(minilm, ["one sentence .", "and another , longer sentence ."],
                         max_length=16)
  got = pj.attention_means(minilm, data, batch_size=8)
  want = means_lib.accumulate(minilm.config, minilm.params, data,
                              pj.api.parallel.make_mesh(1), batch_size=2)
  np.testing.assert_allclose(got.avgs, want.averages(), atol=1e-6)
  assert got.metadata["num_examples"] == 2
  assert data.input_ids[0, 15] == 102  # PAPA layout: the final separator at L - 1.


def test_api_effective_attentions_preserve_outputs(minilm):
  data = pj.encode_texts(minilm, ["a short one .", "x " * 40], max_length=64,
                         papa_layout=False)
  out = minilm.apply(data.input_ids, data.attention_mask, capture_attention=True,
                     capture_values=True)
  eff = pj.effective_attentions(out, data.attention_mask)
  m = data.attention_mask.astype(bool)
  assert m[1].sum() > minilm.config.dim_per_head  # A_eff != A for this one.
  for a, e, v in zip(out.attentions, eff, out.values):
    av, ev = np.einsum("bhqk,bhkd->bhqd", a, v), np.einsum("bhqk,bhkd->bhqd", e, v)
    for b in range(2):
      np.testing.assert_allclose(ev[b][:, m[b]], av[b][:, m[b]], atol=2e-4)
