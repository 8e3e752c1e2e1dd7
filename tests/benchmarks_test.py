"""The accelerator benchmark runs at CPU size (so it cannot rot) and counts FLOPs right."""

import jax
import jax.numpy as jnp
import pytest

import papa_jax as pj
from benchmarks import accelerator
from papa_jax.models.encoder import init_params


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


def test_accelerator_benchmark_small_runs_every_loop_against_hf(tmp_path, capsys):
  rows = accelerator.main(["--small", "--repeats", "1", "--json", str(tmp_path / "r.jsonl")])
  assert [r["loop"] for r in rows] == ["forward", "means", "probe"]
  for r in rows:
    assert r["tflop_per_s"] > 0 and r["vs_hf"] > 0
    assert ("mfu" in r) != ("of_matmul" in r)
  out = capsys.readouterr().out
  assert "Machine:" in out and "| forward |" in out
  assert (tmp_path / "r.jsonl").read_text().count("\n") == 1
