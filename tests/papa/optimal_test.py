"""The loss-optimal constant: its rule, its gradient, and a fit that beats the mean it starts at."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import papa_jax as pj
from papa_jax import attention, convert, run
from papa_jax.papa import means as means_lib
from papa_jax.probing import probes, train
from tests import testing
from tests.testing import require_model, tiny_config


@pytest.mark.unit
def test_constant_logits_apply_as_a_softmax_over_each_examples_real_keys():
  """softmax(logits) masked and renormalised like every constant is the softmax of the logits
  over the example's real keys (rows of padded queries 0); log of a constant gives it back."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 6, 6)).astype(np.float32)
  mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], np.float32)
  got = np.asarray(attention.constant_probs(jax.nn.softmax(jnp.asarray(logits), -1), mask))
  for b in range(2):
    real = mask[b] > 0
    e = np.exp(logits - logits.max(-1, keepdims=True)) * real
    want = e / e.sum(-1, keepdims=True) * real[:, None]
    np.testing.assert_allclose(got[b], want, atol=1e-6)
  mean = rng.random((3, 6, 6)).astype(np.float32)
  mean /= mean.sum(-1, keepdims=True)
  np.testing.assert_allclose(jax.nn.softmax(train.constant_logits(mean), -1), mean, atol=1e-6)


@pytest.fixture(scope="module")
def splade():
  return convert.load_pretrained(require_model("splade_tiny"))


@pytest.mark.integration
def test_constant_logits_gradient_equals_central_differences(splade, sst2_dir):
  """d loss / d logits through the frozen encoder (every head constant) against central
  differences of the loss, at cells of real tokens in both layers."""
  del sst2_dir
  cfg = splade.config
  L = 12
  rng = np.random.default_rng(1)
  batch = dict(input_ids=rng.integers(1000, 2000, (3, L)).astype(np.int32),
               attention_mask=np.array([[1] * L, [1] * 9 + [0] * 3, [1] * 6 + [0] * 6], np.int32),
               token_type_ids=np.zeros((3, L), np.int32), labels=np.array([0, 1, 1], np.int32),
               valid=np.ones(3, bool))
  mean = rng.random((cfg.num_layers, cfg.num_heads, L, L)).astype(np.float32)
  enc = train.FrozenEncoder(splade.params, attention.AttentionOverride.constant(mean), cfg,
                            fit_constants=True)
  probe = probes.SentenceProbe(2, cfg.hidden_size, 0.0)
  feats = enc.features(batch, train=False)
  params = probe.init(jax.random.key(0), feats[:1], jnp.ones((1, L)))["params"]

  def loss(logits):
    f = enc.features(batch, train=False, constant_logits=logits).astype(jnp.float32)
    out = probe.apply({"params": params}, f, batch["attention_mask"], deterministic=True)
    return probes.loss_fn("classification", out, batch["labels"], batch["valid"])[0]

  logits = enc.trainable()["constant_logits"]
  grad = np.asarray(jax.jit(jax.grad(loss))(logits))
  assert np.abs(grad[:, :, :, 9:]).max() > 0  # Keys real only in the first example count.
  eps = 0.05
  for cell in ((0, 0, 2, 3), (1, 1, 5, 0), (0, 1, 0, 8), (1, 0, 7, 7)):
    up, down = np.array(logits), np.array(logits)
    up[cell] += eps
    down[cell] -= eps
    fd = (float(loss(jnp.asarray(up))) - float(loss(jnp.asarray(down)))) / (2 * eps)
    np.testing.assert_allclose(grad[cell], fd, rtol=0.05, atol=2e-6)


@pytest.mark.integration
def test_optimal_constants_fit_lower_train_loss_than_the_mean_they_start_at(tmp_path, monkeypatch):
  """The stage fits the logits from log(mean) with a probe first trained on the mean, on 80%
  of its examples (`optimal.epochs` joint epochs, not the sorting run's): with the logits'
  rate 0 it is PAPA's mean under the same probe, seed and
  data order, and with the sorting run's rate its last train loss is below that; each joint
  epoch goes on from the trained probe (its first epoch lowers the loss the mean started
  at); the epoch kept is the one with the lowest held-out loss, its rows distributions that
  the probe stage uses like any constant."""
  require_model("splade_tiny")
  losses = {}
  for lr in (0.0, 0.05):
    c = tiny_config(tmp_path, **{"model.name": "splade_tiny", "papa.variants": ("raw", "optimal"),
                                 "papa.fractions": (0.0, 1.0), "optimal.learning_rate": lr,
                                 "optimal.epochs": 3, "optimal.probe_epochs": 2,
                                 "sort.epochs": 1})
    wd = str(tmp_path / f"wd{lr}")
    rows = run.run(c, wd)
    m = means_lib.load_means(os.path.join(wd, "means", "means_optimal.npz"))
    raw = means_lib.load_means(os.path.join(wd, "means", "means_raw.npz"))
    fit = m.metadata["fit"]
    losses[lr] = fit["train_loss"][-1]
    assert len(fit["train_loss"]) == len(fit["held_out_loss"]) == 4, fit
    assert fit["examples"] + fit["held_out"] == 48 and fit["held_out"] == 10, fit
    assert fit["epoch"] == int(np.argmin(fit["held_out_loss"])), fit
    assert fit["train_loss"][1] < fit["train_loss"][0], fit  # From the trained probe.
    sums = m.avgs.sum(-1)
    np.testing.assert_allclose(sums, 1.0, atol=1e-5)
    norm = raw.avgs / np.maximum(raw.avgs.sum(-1, keepdims=True), 1e-30)
    seen = raw.counts > 0
    if lr == 0.0 or fit["epoch"] == 0:
      np.testing.assert_allclose(m.avgs[..., seen], norm[..., seen], atol=1e-5)
    else:
      assert np.abs(m.avgs - norm)[..., seen].max() > 1e-3
    assert {(r["variant"], r["static_heads"]) for r in rows} == {
        ("raw", 0), ("raw", 4), ("optimal", 4)}
  assert losses[0.05] < losses[0.0], losses
  # Preempted after epoch 1 was evaluated (its losses saved), in epoch 2's first step: the
  # rerun goes on from there and keeps what an uninterrupted fit keeps.
  from papa_jax import preemption  # pylint: disable=import-outside-toplevel
  from papa_jax.probing import fitting  # pylint: disable=import-outside-toplevel
  calls, armed, real = [], [], fitting.data_loss

  def data_loss(*args, **kwargs):
    out = real(*args, **kwargs)
    calls.append(None)
    if len(calls) == 4 and not armed:  # Epoch 1's held-out loss, computed (once).
      armed.append(None)
      preemption._requested.set()  # pylint: disable=protected-access
    return out

  wd = str(tmp_path / "wd_preempted")
  monkeypatch.setattr(fitting, "data_loss", data_loss)
  try:
    with pytest.raises(preemption.Preempted, match="step 1 of epoch 2"):
      run.run(c, wd)
  finally:
    preemption.reset()
  saved = np.load(os.path.join(wd, "optimal", "selection.npz"))
  assert len(json.loads(str(saved["record"]))["held_out_loss"]) == 2
  calls.clear()
  run.run(c, wd)
  assert len(calls) == 4  # Epochs 2 and 3 only.
  got = means_lib.load_means(os.path.join(wd, "means", "means_optimal.npz"))
  for key in ("train_loss", "held_out_loss", "dev_score", "epoch"):
    np.testing.assert_allclose(got.metadata["fit"][key], m.metadata["fit"][key], rtol=1e-6)
  np.testing.assert_allclose(got.avgs, m.avgs, atol=1e-6)


@pytest.mark.unit
def test_report_compares_every_constant_with_the_loss_optimal_one():
  """vs_optimal: score(constant) - score(optimal) per fraction with the paired interval, in
  the controls' Holm family and their markdown table."""
  from papa_jax import uncertainty  # pylint: disable=import-outside-toplevel
  from papa_jax.data.tasks import get_task  # pylint: disable=import-outside-toplevel
  from papa_jax.report import build, controls  # pylint: disable=import-outside-toplevel
  labels = np.array([0, 1] * 100)
  right = lambda frac, shift: np.where((np.arange(200) + shift) % 200 < frac * 200, labels,
                                       1 - labels)
  preds = {("raw", 0): {0: right(0.9, 0), 1: right(0.88, 7)},
           ("raw", 4): {0: right(0.7, 3), 1: right(0.72, 9)},
           ("uniform", 4): {0: right(0.6, 5), 1: right(0.62, 11)},
           ("optimal", 4): {0: right(0.8, 2), 1: right(0.79, 13)}}
  exp = build.Experiment(model="m", task=get_task("sst2"), total_heads=4, labels=labels,
                         predictions=preds, seeds=(0, 1))
  rep = build.analyse([exp], n_boot=300)
  c = rep["controls"][0]
  got = {r["variant"]: r for r in c["vs_optimal"]}
  assert set(got) == {"raw", "uniform"}
  assert got["raw"]["diff"] == pytest.approx(0.71 - 0.795)
  assert got["uniform"]["verdict"] == "optimal beats uniform"
  reps = {}
  seed = uncertainty.task_seed(0, "sst2")
  for key, cond in (("raw", ("raw", "lambda", 4)), ("optimal", ("optimal", "lambda", 4))):
    _, b = uncertainty.seed_scores(get_task("sst2"), labels, preds[(key, 4)], n_boot=300,
                                   seed=seed)
    reps[key] = uncertainty.seed_means(b, seed=seed, stream=controls._stream(cond))  # pylint: disable=protected-access
  assert got["raw"]["ci"] == uncertainty.percentile_interval(reps["raw"] - reps["optimal"])
  assert len(controls.comparisons(c)) == rep["multiplicity"]["n_control_tests"]
  assert "against the loss-optimal constant" in build.markdown(rep)


@pytest.mark.unit
def test_the_all_heads_claim_gets_a_second_line_with_the_optimal_constant():
  from papa_jax.report import claims  # pylint: disable=import-outside-toplevel
  results, reps = [], []
  for m, (mean_drop, opt_drop) in enumerate(((0.10, 0.04), (0.06, 0.02))):
    reps_mean, reps_opt = mean_drop + np.array([-0.01, 0, 0.01]), opt_drop + np.array([-0.01, 0,
                                                                                       0.01])
    results.append(dict(model=f"m{m}", task="sst2", check=dict(informative=True),
                        baseline=dict(mean=0.8), summary=[
                            dict(variant=v, half=None, all=dict(
                                relative_drop=d, static_heads=4, mean=0.8 * (1 - d)))
                            for v, d in (("raw", mean_drop), ("optimal", opt_drop))]))
    reps.append(dict(drops={("raw", 4): reps_mean, ("optimal", 4): reps_opt},
                     baseline=np.full(3, 0.8)))
  got = {c["key"]: c for c in claims.claims(results, reps, {}, 0.95)}
  assert list(got) == ["all", "all_optimal", "half", "correlation"]
  assert got["all"]["estimate"] == pytest.approx(0.08)
  assert got["all_optimal"]["estimate"] == pytest.approx(0.03)
  assert got["all_optimal"]["verdict"] == "contradicted"  # 8% outside [2%, 4%].
  without = [dict(r, summary=r["summary"][:1]) for r in results]
  assert "all_optimal" not in {c["key"] for c in claims.claims(without, reps, {}, 0.95)}
  # A fit that scores below the mean (here m1's: a 12% drop against 6%) bounds nothing.
  results[1]["summary"][1]["all"].update(relative_drop=0.12, mean=0.8 * 0.88)
  reps[1]["drops"][("optimal", 4)] = 0.12 + np.array([-0.01, 0, 0.01])
  got = {c["key"]: c for c in claims.claims(results, reps, {}, 0.95)}
  assert got["all_optimal"]["cells"] == ["m0/sst2"] and got["all_optimal"]["n"] == 1
  assert "m1/sst2 (the fitted constant scores below PAPA's mean" in got["all_optimal"][
      "left_out"][0]


@pytest.mark.integration
def test_constant_logits_fit_on_8_devices_equals_1(splade, sst2_dir):
  """The optimal constants' fit, data-parallel over 8 CPU devices, equals one device: the
  logits (through the encoder) and the probe, train loss to 1e-5."""
  from papa_jax import parallel  # pylint: disable=import-outside-toplevel
  from papa_jax.data import preprocess, readers, tasks  # pylint: disable=import-outside-toplevel
  from papa_jax.probing import fitting  # pylint: disable=import-outside-toplevel
  task = tasks.get_task("sst2")
  recs = list(readers.read_split(task, str(sst2_dir), "validation"))[:32]
  data = preprocess.encode(task, recs, splade.tokenizer(), 16)
  cfg = splade.config
  mean = np.random.default_rng(0).random((cfg.num_layers, cfg.num_heads, 16, 16))
  enc = train.FrozenEncoder(splade.params, attention.AttentionOverride.constant(
      jnp.asarray(mean, jnp.float32)), cfg, fit_constants=True)
  fit_cfg = train.FitConfig(epochs=1, batch_size=16, eval_batch_size=16, seed=0)
  out = []
  for n in (1, 8):
    state, hist, _ = fitting.fit(
        f"optimal dp{n}", probes.SentenceProbe(2, cfg.hidden_size, 0.0), enc,
        train.make_optimizer(testing.optimizer_config(), gate_learning_rate=0.05), fit_cfg,
        data, data, lambda logits: {}, parallel.make_mesh(n))
    out.append((jax.tree.map(np.asarray, state.params), hist))
  (p1, h1), (p8, h8) = out
  assert h1[0]["train_loss"] == pytest.approx(h8[0]["train_loss"], rel=1e-5)
  moved = np.abs(p1["constant_logits"] - np.asarray(train.constant_logits(mean))).max()
  assert moved > 1e-3
  # Adam steps by ~lr * sign(g): where g is near 0, float32 summation-order noise (8 shards
  # summed vs one) moves a logit by a small fraction of a step (lr = 0.05); 1.5e-4 at most here.
  diff = np.abs(p1["constant_logits"] - p8["constant_logits"])
  assert diff.max() < 0.01 * 0.05 < moved, (diff.max(), moved)


@pytest.mark.unit
def test_results_say_when_the_fitted_constant_is_worse_than_the_mean():
  from papa_jax import results  # pylint: disable=import-outside-toplevel
  row = dict(model="m", task="sst2", variant="raw", ordering="lambda", static_heads=0,
             total_heads=4, fraction=0.0, seed=42, metric="accuracy", score=0.80,
             best_score=0.8, seconds=1.0, run="r")
  rows = [row, dict(row, static_heads=4, fraction=1.0, score=0.79),
          dict(row, variant="optimal", static_heads=4, fraction=1.0, score=0.75)]
  line = results.optimal_warning(rows)
  assert line.startswith("The fitted optimal constant scores 0.7500 with all heads constant, "
                         "below PAPA's mean (0.7900)")
  rows[2]["score"] = 0.795
  assert results.optimal_warning(rows) == "" == results.optimal_warning(rows[:2])


@pytest.mark.unit
@pytest.mark.parametrize("field,value,message", [
    ("epochs", 0, r"optimal.epochs=0: use >= 1, or -1 for sort.epochs"),
    ("probe_epochs", -2, r"optimal.probe_epochs=-2"),
    ("learning_rate", -0.1, r"optimal.learning_rate=-0.1: use >= 0"),
    ("held_out", 1.0, r"optimal.held_out=1.0: use a share in \(0, 1\)"),
])
def test_the_optimal_group_names_a_bad_value(field, value, message):
  from configs import quickstart  # pylint: disable=import-outside-toplevel
  from papa_jax.config import schema  # pylint: disable=import-outside-toplevel
  c = quickstart.get_config()
  schema.validate(c)
  setattr(c.optimal, field, value)
  with pytest.raises(schema.ConfigError, match=message):
    schema.validate(c)


@pytest.mark.unit
def test_a_probe_on_fitted_constants_depends_on_the_fit_and_no_other_probe_does():
  """The optimal group enters the fingerprint of a probe on the optimal constants only, so
  the raw and uniform probes of old workdirs keep theirs."""
  from configs import quickstart  # pylint: disable=import-outside-toplevel
  from papa_jax.papa import probe  # pylint: disable=import-outside-toplevel

  class Setup:
    config = quickstart.get_config()
  assert probe.fit_unit(Setup, "raw") == {} == probe.fit_unit(Setup, "uniform")
  before = probe.fit_unit(Setup, "optimal")
  Setup.config.optimal.learning_rate = 0.01
  assert probe.fit_unit(Setup, "optimal") != before


@pytest.mark.unit
def test_the_task_free_error_sums_real_tokens_of_valid_rows(random_hf):
  """`_hidden_error` = numpy's sums over the real tokens of valid rows of |h_const - h|^2 and
  |h|^2, h the last hidden state without override, h_const with every head at softmax(logits)
  (masked and renormalised); a padding row (valid False) counts nothing."""
  from papa_jax.papa import optimal  # pylint: disable=import-outside-toplevel
  from tests import hf_oracle  # pylint: disable=import-outside-toplevel
  model = random_hf("bert")[1]
  c = model.config
  ids, mask = hf_oracle.padded_batch(c.vocab_size, (8, 5, 3), 8, c.pad_token_id)
  logits = np.random.default_rng(0).standard_normal((c.num_layers, c.num_heads, 8, 8))
  batch = dict(input_ids=ids, attention_mask=mask, token_type_ids=np.zeros_like(ids),
               valid=np.array([True, True, False]))
  err, ref = optimal._hidden_error(c, model.params, jnp.asarray(logits, jnp.float32), batch)
  const = pj.AttentionOverride.constant(jax.nn.softmax(jnp.asarray(logits, jnp.float32), -1))
  h_const = np.asarray(model.apply(ids, mask, override=const).last_hidden_state, np.float64)
  h = np.asarray(model.apply(ids, mask).last_hidden_state, np.float64)
  m = mask.astype(bool) & batch["valid"][:, None]
  np.testing.assert_allclose(float(err), ((h_const - h) ** 2).sum(-1)[m].sum(), rtol=1e-4)
  np.testing.assert_allclose(float(ref), (h ** 2).sum(-1)[m].sum(), rtol=1e-5)


@pytest.mark.integration
def test_the_task_free_fit_lowers_the_held_out_hidden_state_error(tmp_path):
  """objective=hidden: no probe; at rate 0 the rows are the mean and every epoch's error
  equals the mean's; at 0.05 the error on the fit's examples falls, the epoch kept has the
  lowest held-out error, below the mean's."""
  require_model("splade_tiny")
  fits = {}
  for lr in (0.0, 0.05):
    c = tiny_config(tmp_path, **{"model.name": "splade_tiny", "papa.variants": ("raw", "optimal"),
                                 "papa.fractions": (0.0, 1.0), "optimal.learning_rate": lr,
                                 "optimal.objective": "hidden", "optimal.epochs": 2})
    wd = str(tmp_path / f"wd{lr}")
    run.run(c, wd)
    m = means_lib.load_means(os.path.join(wd, "means", "means_optimal.npz"))
    fits[lr] = fit = m.metadata["fit"]
    assert fit["objective"] == "hidden" and len(fit["train_loss"]) == 3, fit
    assert not os.path.exists(os.path.join(wd, "optimal", "probe")), "a probe was trained"
    if lr == 0.0:
      raw = means_lib.load_means(os.path.join(wd, "means", "means_raw.npz"))
      seen = raw.counts > 0
      norm = raw.avgs / np.maximum(raw.avgs.sum(-1, keepdims=True), 1e-30)
      np.testing.assert_allclose(m.avgs[..., seen], norm[..., seen], atol=1e-5)
  still, moved = fits[0.0], fits[0.05]
  np.testing.assert_allclose(still["train_loss"], still["train_loss"][0], rtol=1e-6)
  assert moved["train_loss"][-1] < moved["train_loss"][0], moved
  assert moved["epoch"] > 0 and moved["held_out_loss"][moved["epoch"]] < moved[
      "held_out_loss"][0], moved
  assert moved["held_out_loss"][0] == pytest.approx(still["held_out_loss"][0], rel=1e-6)


@pytest.mark.integration
def test_the_task_free_fit_on_8_devices_equals_1(tmp_path):
  """The hidden-state fit data-parallel over 8 CPU devices equals one device: its errors per
  epoch to 1e-5 and its rows to a small fraction of an Adam step."""
  require_model("splade_tiny")
  got = {}
  for n in (1, 8):
    c = tiny_config(tmp_path, **{"model.name": "splade_tiny", "papa.variants": ("raw", "optimal"),
                                 "papa.fractions": (0.0, 1.0), "optimal.objective": "hidden",
                                 "optimal.epochs": 1, "optimal.learning_rate": 0.05,
                                 "run.num_devices": n, "stage": "optimal"})
    wd = str(tmp_path / f"dp{n}")
    run.run(c, wd)
    got[n] = means_lib.load_means(os.path.join(wd, "means", "means_optimal.npz"))
  f1, f8 = (got[n].metadata["fit"] for n in (1, 8))
  np.testing.assert_allclose(f1["train_loss"], f8["train_loss"], rtol=1e-5)
  np.testing.assert_allclose(f1["held_out_loss"], f8["held_out_loss"], rtol=1e-5)
  assert f1["train_loss"][1] < f1["train_loss"][0]
  np.testing.assert_allclose(got[1].avgs, got[8].avgs, atol=1e-3)
