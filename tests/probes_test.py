"""Probes: shapes, masking, a frozen encoder (no backward pass), learning on real data."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from papa_jax import parallel
from papa_jax.probing import fitting, probes, train
from papa_jax.attention import AttentionOverride
from papa_jax.data import pipeline, preprocess, readers, tasks
from tests.testing import optimizer_config


@pytest.mark.integration
@pytest.mark.parametrize("k,d,batch", [(13, 768, 3), (25, 1024, 1)])
def test_probe_sentence_shapes_base_large_and_batch_one(k, d, batch):
  probe = probes.SentenceProbe(num_labels=3, hidden_size=d)
  x = jnp.ones((batch, k, 16, d))
  params = probe.init(jax.random.key(0), x, jnp.ones((batch, 16)))["params"]
  assert params["weights_per_layer"].shape == (k, 16)
  np.testing.assert_allclose(params["weights_per_layer"], 1 / 16)
  assert probe.apply({"params": params}, x, jnp.ones((batch, 16))).shape == (batch, 3)
  tok = probes.TokenProbe(num_labels=9, hidden_size=d)
  tp = tok.init(jax.random.key(0), x, None)["params"]
  assert tok.apply({"params": tp}, x, None).shape == (batch, 16, 9)


@pytest.mark.unit
def test_probe_pooling_ignores_padded_positions():
  probe = probes.SentenceProbe(num_labels=2, hidden_size=8)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 3, 6, 8)).astype(np.float32)
  mask = np.array([[1, 1, 1, 0, 0, 0]] * 2, np.float32)
  params = probe.init(jax.random.key(0), x, mask)["params"]
  y = x.copy()
  y[:, :, 3:] = rng.normal(size=(2, 3, 3, 8))
  np.testing.assert_allclose(probe.apply({"params": params}, x, mask),
                             probe.apply({"params": params}, y, mask), atol=1e-6)
  # At initialisation the pooled vector is the masked *sum* over L (spec §10.8).
  v = np.einsum("bkld,kl,bl->bkd", x, np.asarray(params["weights_per_layer"]), mask)
  np.testing.assert_allclose(v[0, 0], x[0, 0, :3].sum(0) / 6, rtol=1e-5)


def _count(jaxpr, name="dot_general") -> int:
  """`name` equations a run executes: sub-jaxprs included, one branch of a `cond` (the
  platform-dependent steps of `papa_jax/backend.py` are conds over their paths)."""
  n = 0
  for eqn in jaxpr.eqns:
    n += eqn.primitive.name == name
    if eqn.primitive.name == "cond":
      n += max(_count(b.jaxpr, name) for b in eqn.params["branches"])
      continue
    for p in eqn.params.values():
      for sub in (p if isinstance(p, (list, tuple)) else [p]):
        if hasattr(sub, "jaxpr"):
          n += _count(sub.jaxpr if hasattr(sub.jaxpr, "eqns") else sub.jaxpr.jaxpr, name)
        elif hasattr(sub, "eqns"):
          n += _count(sub, name)
  return n


def _batch(L: int, n: int = 4) -> dict:
  ids = jnp.ones((n, L), jnp.int32)
  return dict(input_ids=ids, attention_mask=jnp.ones_like(ids), token_type_ids=jnp.zeros_like(ids),
              labels=jnp.zeros(n, jnp.int32), valid=jnp.ones(n, bool))


@pytest.mark.integration
@pytest.mark.parametrize("static", [False, True])
def test_probe_step_has_no_backward_pass_through_encoder(minilm, static):
  """The step's dot_generals are the encoder's forward ones plus the probe's, exactly."""
  cfg, L = minilm.config, 16
  constants = jnp.full((cfg.num_layers, cfg.num_heads, L, L), 1 / L)
  encoder = train.FrozenEncoder(minilm.params,
                                AttentionOverride.constant(constants) if static else None, cfg)
  probe = probes.SentenceProbe(2, cfg.hidden_size, 0.1)
  tx = train.make_optimizer(optimizer_config())
  state = train.init_state(probe, encoder, tx, 0, L)
  batch = _batch(L)
  step = train.make_train_step(probe, tx, 0)
  full = _count(jax.make_jaxpr(step)(state, batch, encoder).jaxpr)
  forward = _count(jax.make_jaxpr(
      lambda e, b: e.features(b, train=True, rng=jax.random.key(0)))(encoder, batch).jaxpr)
  feats = dict(batch, features=jnp.ones((4, cfg.num_hidden_states, L, cfg.hidden_size)))
  probe_only = _count(jax.make_jaxpr(step)(state, feats, encoder).jaxpr)
  assert forward >= cfg.num_layers * (2 if static else 4)
  assert full == forward + probe_only  # The encoder appears forward only.

  # The counter sees a backward pass when there is one: differentiating the
  # same loss with respect to the encoder's weights adds their gradients.
  def leaky(params):
    e = train.FrozenEncoder(params, encoder.override, cfg)
    return jnp.sum(e.features(batch, train=False).astype(jnp.float32))
  leaked = _count(jax.make_jaxpr(jax.grad(leaky))(minilm.params).jaxpr)
  assert leaked > forward + cfg.num_layers * 4

  # Gated (sorting) steps do differentiate through the encoder, for the gates.
  gated = train.FrozenEncoder(minilm.params,
                              AttentionOverride.gated(constants, jnp.zeros(constants.shape[:2])),
                              cfg)
  gtx = train.make_optimizer(optimizer_config(), gate_learning_rate=1e-2)
  gstate = train.init_state(probe, gated, gtx, 0, L)
  gcount = _count(jax.make_jaxpr(train.make_train_step(probe, gtx, 0))(gstate, batch, gated).jaxpr)
  assert gcount > forward + probe_only + cfg.num_layers * 4


@pytest.mark.integration
def test_probe_loss_decreases_on_real_data_all_heads_static(minilm, minilm_tokenizer, sst2_dir):
  task = tasks.get_task("sst2")
  recs = list(readers.read_split(task, str(sst2_dir), "validation"))[:64]
  data = preprocess.encode(task, recs, minilm_tokenizer, 32)
  cfg = minilm.config
  constants = jnp.full((cfg.num_layers, cfg.num_heads, 32, 32), 1 / 32)
  encoder = train.FrozenEncoder(minilm.params, AttentionOverride.constant(constants), cfg)
  probe = probes.SentenceProbe(2, cfg.hidden_size, 0.0)
  tx = train.make_optimizer(optimizer_config())
  state = train.init_state(probe, encoder, tx, 0, 32)
  step = jax.jit(train.make_train_step(probe, tx, 0))
  mesh = parallel.make_mesh(1)
  losses = []
  for epoch in range(4):
    for b in pipeline.batches(data, 16, shuffle=True, seed=0, epoch=epoch):
      state, loss = step(state, parallel.put_batch(b, mesh), encoder)
      losses.append(float(loss))
  assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4]), losses


@pytest.mark.unit
def test_probe_losses_match_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(4, 3)).astype(np.float32)
  labels = np.array([0, 2, 1, 1])
  valid = np.array([True, True, True, False])
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  ce = -logp[np.arange(4), labels]
  got, n = probes.loss_fn("classification", logits, labels, valid)
  np.testing.assert_allclose(got, ce[:3].mean(), rtol=1e-6)
  assert n == 3
  got, _ = probes.loss_fn("regression", logits[:, :1], labels.astype(np.float32), valid)
  np.testing.assert_allclose(got, ((logits[:3, 0] - labels[:3]) ** 2).mean(), rtol=1e-6)
  tl = rng.normal(size=(2, 3, 4)).astype(np.float32)
  tags = np.array([[1, preprocess.IGNORE, 3], [0, 2, preprocess.IGNORE]])
  lp = tl - np.log(np.exp(tl).sum(-1, keepdims=True))
  want = -np.mean([lp[0, 0, 1], lp[0, 2, 3], lp[1, 0, 0], lp[1, 1, 2]])
  got, n = probes.loss_fn("tagging", tl, tags, np.array([True, True]))
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert n == 4


@pytest.mark.integration
def test_shard_probe_training_8_devices_equals_1(minilm, minilm_tokenizer, sst2_dir):
  """Data-parallel training (global batch split over the mesh) = one device, dropout on."""
  task = tasks.get_task("sst2")
  recs = list(readers.read_split(task, str(sst2_dir), "validation"))[:40]
  data = preprocess.encode(task, recs, minilm_tokenizer, 16)
  cfg = minilm.config
  encoder = train.FrozenEncoder(minilm.params, None, cfg, dropout=True)
  fit_cfg = train.FitConfig(epochs=1, batch_size=16, eval_batch_size=16, seed=0)
  out = []
  for n in (1, 8):
    state, hist, _ = fitting.fit(
        f"dp{n}", probes.SentenceProbe(2, cfg.hidden_size, 0.1), encoder,
        train.make_optimizer(optimizer_config()), fit_cfg, data, data,
        lambda logits: {"acc": float((logits.argmax(-1) == data.labels).mean())},
        parallel.make_mesh(n))
    out.append((jax.tree.map(np.asarray, state.params), hist))
  (p1, h1), (p8, h8) = out
  assert h1[0]["train_loss"] == pytest.approx(h8[0]["train_loss"], rel=1e-5)
  # Adam steps by ~lr * sign(g) where g is tiny, so float32 summation-order
  # noise in such gradients can move a parameter by a fraction of lr (1e-3).
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p8)):
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
    assert np.mean(np.abs(a - b) > 1e-6) < 1e-3  # Almost all agree to 1e-6.
