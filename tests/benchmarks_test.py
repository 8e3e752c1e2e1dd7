"""Benchmark scripts: the accelerator benchmark runs at CPU size (so it cannot rot) and counts
FLOPs right; the workdir comparison's difference, interval and changed predictions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import papa_jax as pj
from benchmarks import accelerator
from papa_jax.models.encoder import init_params
from tests.testing import require_model


@pytest.mark.integration
@pytest.mark.parametrize("constant", [False, True])
def test_model_flops_are_the_matmuls_of_the_compiled_forward(constant):
  # XLA's count adds the elementwise work (softmax, GELU, LayerNorm): a few
  # percent above the matmuls at this size. A missing or extra matmul term
  # (e.g. Q/K on the constant path) moves the ratio out of the band.
  c = pj.EncoderConfig(**accelerator.SIZES["small"])
  b, l = 8, 32
  x = accelerator._inputs(c, b, l)
  override = None
  if constant:
    override = pj.AttentionOverride.constant(
        jnp.full((c.num_layers, c.num_heads, l, l), 1.0 / l))
  enc = pj.Encoder(c)
  fwd = jax.jit(lambda p, x: enc.apply({"params": p}, x["input_ids"], x["attention_mask"],
                                       x["token_type_ids"], override=override).hidden_states)
  xla = fwd.lower(init_params(c), x).compile().cost_analysis()["flops"]
  ratio = accelerator.model_flops(c, b, l, constant=constant) / xla
  assert 0.85 < ratio <= 1.0, ratio


@pytest.mark.integration
def test_accelerator_benchmark_small_runs_every_loop_against_hf(tmp_path, capsys):
  """Every loop, then the quickstart here beside the CPU's in a child process (here both are
  the CPU, so they agree exactly)."""
  require_model("splade_tiny")
  rows = accelerator.main(["--small", "--repeats", "1", "--json", str(tmp_path / "r.jsonl")])
  loops, qs = rows[:3], rows[3:]
  assert [r["loop"] for r in loops] == ["forward", "means", "probe"]
  for r in loops:
    assert r["tflop_per_s"] > 0 and r["vs_hf"] > 0
    assert ("mfu" in r) != ("of_matmul" in r)
    assert r["plan_gib"] > 0 and "peak_gib" not in r  # CPU reports no peak.
  assert [r["static_heads"] for r in qs] == [0, 4]  # SPLADE-tiny: 2 layers x 2 heads.
  for r in qs:
    assert r["n_dev"] == 64 and 0 < r["cpu"] == r["device"] <= 1
    assert r["difference"] == r["changed"] == 0 and r["within_bound"]
  out = capsys.readouterr().out
  assert "Machine:" in out and "| forward |" in out and "| splade_tiny | 4 | 64 |" in out
  assert (tmp_path / "r.jsonl").read_text().count("\n") == 2


@pytest.mark.unit
def test_accelerator_quickstart_bound_needs_zero_inside_the_interval_and_a_small_difference():
  row = dict(within_noise=True, difference=-accelerator.BF16_BOUND)
  assert accelerator.within_bound(row)
  assert not accelerator.within_bound(dict(row, difference=-0.0035))
  assert not accelerator.within_bound(dict(row, within_noise=False, difference=0.001))


@pytest.mark.unit
def test_compare_workdirs_difference_interval_and_changed_predictions():
  from benchmarks import compare_workdirs  # pylint: disable=import-outside-toplevel
  from papa_jax import data as data_lib  # pylint: disable=import-outside-toplevel
  from papa_jax.report.build import Experiment  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 2, 400)
  right = lambda p: np.where(rng.random(400) < p, labels, 1 - labels)  # noqa: E731
  same = {s: right(0.8) for s in (42, 43)}
  worse = {s: np.where(np.arange(400) < 80, 1 - labels, v) for s, v in same.items()}
  task = data_lib.get_task("sst2")

  def exp(preds, ranking):
    return Experiment(model="m", task=task, total_heads=4, labels=labels,
                      predictions={("raw", 0): preds}, scores={}, means=None, gates=None,
                      ranking=ranking, train_examples=1, eval_examples=400)

  rows = compare_workdirs.compare(exp(same, [[0, 1], [0, 0]]), exp(same, [[0, 0], [0, 1]]),
                                  n_boot=300)
  assert rows[0]["difference"] == 0 and rows[0]["within_noise"]
  assert rows[0]["changed_predictions"] == [0, 0] and rows[0]["seeds"] == [42, 43]
  rows = compare_workdirs.compare(exp(same, None), exp(worse, None), n_boot=300)
  acc = lambda p: np.mean([np.mean(v == labels) for v in p.values()])  # noqa: E731
  np.testing.assert_allclose(rows[0]["difference"], acc(worse) - acc(same))
  assert rows[0]["difference_ci"][1] < 0 and not rows[0]["within_noise"]
  assert rows[0]["changed_predictions"] == [int(np.sum(same[s][:80] == labels[:80]))
                                           for s in (42, 43)]
  assert "| raw | 0 | 2 |" in compare_workdirs.markdown(rows, "a", "b")
  with pytest.raises(ValueError, match="same task"):
    compare_workdirs.compare(exp(same, None), Experiment(
        model="m", task=task, total_heads=4, labels=1 - labels, predictions={}, scores={},
        means=None, gates=None, ranking=None, train_examples=1, eval_examples=400))


@pytest.mark.integration
@pytest.mark.parametrize("impl", ["papa_jax", "reference"])
def test_mixing_benchmark_runs_each_side_at_tiny_size(impl, minilm):
  """The context-mixing benchmark's per-process measurement, at 2 sentences of 12 tokens."""
  del minilm  # Skips when the packaged MiniLM is absent.
  from benchmarks import mixing_bench
  r = mixing_bench.one(impl, "alti", batch=2, length=12, repeats=1)
  assert r["sentences"] == 2 and r["s_per_sentence"] > 0
  assert r["peak_rss_mb"] >= r["rss_before_mb"] > 0


@pytest.mark.integration
@pytest.mark.parametrize("side", ["new", "hf"])
def test_regression_ab_child_times_every_workload_at_tiny_size(side, minilm, monkeypatch):
  """One side's process of the two-commit A/B, at batch 2, forward length 16, means length 8."""
  del minilm  # Skips when the packaged MiniLM is absent.
  import os  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  from benchmarks import regression_ab  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv("PAPA_CPU_TUNING", "off")  # The child applies the tree's settings.
  monkeypatch.setattr(sys, "path", list(sys.path))  # It puts its tree first.
  r = regression_ab.child(side, regression_ab.ROOT, [8], repeats=2, batch=2, fwd_length=16)
  want = ["forward", "means8"] + (["means8_a"] if side == "new" else [])
  assert list(r["results"]) == want  # The raw pass also sums the extras: "_a" without.
  for times in r["results"].values():
    assert len(times["wall"]) == len(times["user"]) == 2 and min(times["wall"]) > 0
  assert r["xla_flags"] == os.environ.get("XLA_FLAGS", "")


@pytest.mark.unit
def test_regression_ab_table_ratios_are_per_round_medians():
  from benchmarks import regression_ab  # pylint: disable=import-outside-toplevel
  run = lambda **walls: dict(results={k: dict(wall=[w], user=[w / 2])  # noqa: E731
                                      for k, w in walls.items()})
  runs = dict(hf=[run(forward=0.1), run(forward=0.2), run(forward=0.4)],
              old=[run(forward=0.1), run(forward=0.1), run(forward=0.1)],
              new=[run(forward=0.05, forward_a=0.1), run(forward=0.05, forward_a=0.1),
                   run(forward=0.4, forward_a=0.1)])
  lines = regression_ab.table(runs, dict(hf="HF", old="A", new="B"))
  # B's per-round ratios to HF are 2, 4 and 1: median 2, where the ratio of the medians
  # (0.2 / 0.05) would say 4. "_a" rows are compared with HF's plain workload.
  assert lines[2:] == ["| forward | HF | 5.0 | 2.5-10.0 | 100.00 | 1.00 |",
                       "| forward | A | 10.0 | 10.0-10.0 | 50.00 | 2.00 |",
                       "| forward | B | 20.0 | 2.5-20.0 | 25.00 | 2.00 |",
                       "| forward_a | B | 10.0 | 10.0-10.0 | 50.00 | 2.00 |"]
