"""Probes: shapes, masking, a frozen encoder (no backward pass), learning on real data."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import ConfigDict

from papa_jax import parallel, probes, train
from papa_jax.data import pipeline, preprocess, readers, tasks


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
  n = 0
  for eqn in jaxpr.eqns:
    n += eqn.primitive.name == name
    for p in eqn.params.values():
      for sub in (p if isinstance(p, (list, tuple)) else [p]):
        if hasattr(sub, "jaxpr"):
          n += _count(sub.jaxpr if hasattr(sub.jaxpr, "eqns") else sub.jaxpr.jaxpr, name)
        elif hasattr(sub, "eqns"):
          n += _count(sub, name)
  return n


def _probe_cfg(**kw):
  return ConfigDict(dict(dict(learning_rate=1e-3, adam_b1=0.9, adam_b2=0.999, adam_eps=1e-8,
                              weight_decay=0.0, grad_clip_norm=1.0), **kw))


@pytest.mark.parametrize("static", [False, True])
def test_probe_step_has_no_backward_pass_through_encoder(minilm, static):
  cfg = minilm.config
  L = 16
  heads = np.ones((cfg.num_layers, cfg.num_heads), bool) if static else None
  spec = train.EncoderSpec(cfg, static_heads=heads)
  probe = probes.SentenceProbe(2, cfg.hidden_size, 0.1)
  tx = train.make_optimizer(_probe_cfg())
  state = train.init_state(probe, spec, tx, 0, L)
  ids = jnp.ones((4, L), jnp.int32)
  batch = dict(input_ids=ids, attention_mask=jnp.ones_like(ids), token_type_ids=jnp.zeros_like(ids),
               labels=jnp.zeros(4, jnp.int32), valid=jnp.ones(4, bool))
  constants = jnp.full((cfg.num_layers, cfg.num_heads, L, L), 1 / L)
  step = train.make_train_step(probe, "classification", spec, tx, 0)
  full = _count(jax.make_jaxpr(step)(state, batch, minilm.params, constants).jaxpr)
  encoder = _count(jax.make_jaxpr(
      lambda p, b, c: spec.features(p, c, None, b, train=True))(minilm.params, batch, constants).jaxpr)
  feats = dict(batch, features=jnp.ones((4, cfg.num_hidden_states, L, cfg.hidden_size)))
  probe_only = _count(jax.make_jaxpr(step)(state, feats, minilm.params, constants).jaxpr)
  assert encoder >= cfg.num_layers * 4
  assert full == encoder + probe_only  # The encoder appears forward only.
  # Gated (sorting) steps do differentiate through the encoder, for the gates.
  gspec = train.EncoderSpec(cfg, gated=True)
  gtx = train.make_optimizer(_probe_cfg(), gate_learning_rate=1e-2)
  gstate = train.init_state(probe, gspec, gtx, 0, L)
  gstep = train.make_train_step(probe, "classification", gspec, gtx, 0)
  gated = _count(jax.make_jaxpr(gstep)(gstate, batch, minilm.params, constants).jaxpr)
  assert gated > encoder + probe_only + cfg.num_layers * 4


def test_probe_loss_decreases_on_real_data_all_heads_static(minilm, minilm_tokenizer, sst2_dir):
  task = tasks.get_task("sst2")
  recs = list(readers.read_split(task, str(sst2_dir), "validation"))[:64]
  data = preprocess.encode(task, recs, minilm_tokenizer, 32)
  cfg = minilm.config
  heads = np.ones((cfg.num_layers, cfg.num_heads), bool)
  spec = train.EncoderSpec(cfg, static_heads=heads)
  constants = jnp.full((cfg.num_layers, cfg.num_heads, 32, 32), 1 / 32)
  probe = probes.SentenceProbe(2, cfg.hidden_size, 0.0)
  tx = train.make_optimizer(_probe_cfg())
  state = train.init_state(probe, spec, tx, 0, 32)
  step = jax.jit(train.make_train_step(probe, "classification", spec, tx, 0))
  mesh = parallel.make_mesh(1)
  losses = []
  for epoch in range(4):
    for b in pipeline.batches(data, 16, shuffle=True, seed=0, epoch=epoch):
      state, loss = step(state, parallel.put_batch(b, mesh), minilm.params, constants)
      losses.append(float(loss))
  assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4]), losses


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


def test_shard_probe_training_8_devices_equals_1(minilm, minilm_tokenizer, sst2_dir):
  """Data-parallel training (global batch split over the mesh) = one device, dropout on."""
  task = tasks.get_task("sst2")
  recs = list(readers.read_split(task, str(sst2_dir), "validation"))[:40]
  data = preprocess.encode(task, recs, minilm_tokenizer, 16)
  cfg = minilm.config
  spec = train.EncoderSpec(cfg, dropout=True)
  fit_cfg = train.FitConfig(epochs=1, batch_size=16, eval_batch_size=16, seed=0)
  out = []
  for n in (1, 8):
    state, hist = train.fit(
        name=f"dp{n}", probe=probes.SentenceProbe(2, cfg.hidden_size, 0.1),
        kind="classification", spec=spec, tx=train.make_optimizer(_probe_cfg()),
        fit_cfg=fit_cfg, train_data=data, eval_data=data, enc_params=minilm.params,
        constants=None, mesh=parallel.make_mesh(n),
        score_fn=lambda logits: {"acc": float((logits.argmax(-1) == data.labels).mean())},
        ckpt_dir=None, fingerprint="x", max_length=16)
    out.append((jax.tree.map(np.asarray, state.params), hist))
  (p1, h1), (p8, h8) = out
  assert h1[0]["train_loss"] == pytest.approx(h8[0]["train_loss"], rel=1e-5)
  # Adam steps by ~lr * sign(g) where g is tiny, so float32 summation-order
  # noise in such gradients can move a parameter by a fraction of lr (1e-3).
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p8)):
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
    assert np.mean(np.abs(a - b) > 1e-6) < 1e-3  # Almost all agree to 1e-6.
