"""Feature caching: same results as computing the encoder every step; budget refusal."""

import os
import tempfile
from unittest import mock

import jax
import numpy as np
import pytest
from papa_jax import parallel
from papa_jax.probing import features, fitting, metrics, probes, train
from papa_jax.attention import AttentionOverride
from papa_jax.papa import means as means_lib
from papa_jax.data import preprocess, readers, tasks
from tests.testing import optimizer_config, require_shared


@pytest.fixture(scope="module")
def small(minilm_tokenizer, sst2_dir):
  task = tasks.get_task("sst2")
  recs = list(readers.read_split(task, str(sst2_dir), "validation"))
  enc = lambda rs: preprocess.encode(task, rs, minilm_tokenizer, 32)
  return task, enc(recs[:80]), enc(recs[80:120])


@pytest.mark.slow
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("cache_dir", [False, True])
def test_cached_probe_equals_uncached(minilm, small, static, cache_dir, tmp_path):
  task, tr, ev = small
  cfg = minilm.config
  override = None
  if static:
    override = AttentionOverride.constant(
        np.full((cfg.num_layers, cfg.num_heads, 32, 32), 1 / 32, np.float32))
  encoder = train.FrozenEncoder(minilm.params, override, cfg, feature_dtype="bfloat16")
  mesh = parallel.make_mesh(-1)
  fit_cfg = train.FitConfig(epochs=3, batch_size=16, eval_batch_size=16, seed=42)
  score = lambda logits: metrics.task_scores(task, logits, ev.labels)

  def fit(train_data, eval_data):
    probe = probes.SentenceProbe(2, cfg.hidden_size, 0.1)
    state, hist, _ = fitting.fit("t", probe, encoder, train.make_optimizer(optimizer_config()),
                               fit_cfg, train_data, eval_data, score, mesh)
    return state, hist

  state_u, hist_u = fit(tr, ev)
  path = lambda s: str(tmp_path / f"{s}.npy") if cache_dir else ""
  ftr = features.compute(encoder, tr, mesh, 16, path("train"))
  fev = features.compute(encoder, ev, mesh, 16, path("eval"))
  assert ftr.features.shape == (80, 7, 32, 384)
  assert str(ftr.features.dtype) == "bfloat16"
  state_c, hist_c = fit(ftr, fev)
  for a, b in zip(hist_u, hist_c):
    assert a["accuracy"] == pytest.approx(b["accuracy"], abs=1 / 40 + 1e-9)  # <= 1 example.
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=2e-3)
  for a, b in zip(jax.tree.leaves(state_u.params), jax.tree.leaves(state_c.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-4, rtol=2e-3)


@pytest.mark.unit
def test_invalid_cache_over_budget_is_refused():
  n = features.cache_bytes(67349, 13, 64, 768, "bfloat16")
  assert n == 67349 * 13 * 64 * 768 * 2
  with pytest.raises(features.CacheTooLarge,
                     match=r"needs 80.1. GiB, over the budget run.cache_max_gb=8"):
    features.check_budget(n, 8.0, "SST-2 train")
  features.check_budget(n, 100.0, "SST-2 train")


@pytest.mark.integration
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_means_pass_features_equal_the_feature_pass_bitwise(minilm, small, dtype):
  """The means pass's forward doubles as the baseline's feature pass (one fewer pass)."""
  from papa_jax.papa import means as means_lib
  _, tr, _ = small
  mesh = parallel.make_mesh(-1)
  state = means_lib.accumulate(minilm.config, minilm.params, tr, mesh, batch_size=16,
                               feature_dtype=dtype)
  want = features.compute(train.FrozenEncoder(minilm.params, None, minilm.config,
                                              feature_dtype=dtype), tr, mesh, 16)
  assert state.features.dtype == want.features.dtype and state.num_examples == 80
  np.testing.assert_array_equal(state.features.view(np.uint8), want.features.view(np.uint8))
  plain = means_lib.accumulate(minilm.config, minilm.params, tr, mesh, batch_size=16)
  np.testing.assert_array_equal(plain.sums, state.sums)  # The means are unchanged.


@pytest.fixture(scope="module")
def cached_small(minilm, small):
  """Real MiniLM features of 80 SST-2 dev sentences (train) and 40 more (eval)."""
  task, tr, ev = small
  encoder = train.FrozenEncoder(minilm.params, None, minilm.config, feature_dtype="bfloat16")
  mesh = parallel.make_mesh(1)  # Probes train together on one device.
  ftr, fev = features.compute(encoder, tr, mesh, 16), features.compute(encoder, ev, mesh, 16)
  assert fitting.vectorisable(ftr, mesh) and fitting.vectorisable(fev, mesh)
  assert isinstance(ftr.features, jax.Array)  # Held once, on the device.
  return task, encoder, mesh, ftr, fev


def _fit_args(minilm, cached_small, seeds, tmp_path, tag, splits=None):
  task, encoder, mesh, ftr, fev = cached_small
  ftr, fev = splits or (ftr, fev)
  cfgs = [train.FitConfig(epochs=3, batch_size=16, eval_batch_size=16, seed=s,
                          checkpoint_dir=str(tmp_path / f"{tag}{s}"), fingerprint=f"fp{s}")
          for s in seeds]
  return ("t", probes.SentenceProbe(2, minilm.config.hidden_size, 0.1), encoder,
          train.make_optimizer(optimizer_config()), cfgs, ftr, fev,
          lambda logits: metrics.task_scores(task, logits, fev.labels), mesh)


SEEDS = (42, 43, 44)


@pytest.fixture(scope="module")
def group_run(minilm, cached_small, tmp_path_factory):
  """Three seeds trained together, uninterrupted."""
  args = _fit_args(minilm, cached_small, SEEDS, tmp_path_factory.mktemp("group"), "g")
  return fitting.fit_many(*args)


def _assert_same(one, many):
  """Histories, dev predictions and parameters of a probe trained alone vs in a group:
  equal up to float reassociation (vmapped matmuls), so at most one of 40 dev
  predictions may differ."""
  (s1, h1, l1), (s2, h2, l2) = one, many
  assert len(h1) == len(h2) == 3
  for a, b in zip(h1, h2):
    assert a["accuracy"] == pytest.approx(b["accuracy"], abs=1 / 40 + 1e-9)
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
  assert np.sum(l1.argmax(-1) != l2.argmax(-1)) <= 1
  np.testing.assert_allclose(l1, l2, atol=1e-4)
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)


@pytest.mark.integration
def test_probes_trained_together_equal_each_trained_alone(minilm, cached_small, group_run,
                                                          tmp_path):
  """Three seeds in one vmapped step == three sequential `fit`s, on real features; the
  seeds differ from each other (a group that ignored its seeds would pass equality)."""
  name, probe, enc, tx, cfgs, ftr, fev, score, mesh = _fit_args(minilm, cached_small, SEEDS,
                                                                tmp_path, "one")
  for cfg, together in zip(cfgs, group_run):
    _assert_same(fitting.fit(name, probe, enc, tx, cfg, ftr, fev, score, mesh), together)
  assert not np.allclose(group_run[0][2], group_run[1][2], atol=1e-3)


@pytest.mark.integration
def test_probes_trained_from_a_features_file_equal_those_from_memory(minilm, small, cached_small,
                                                                     group_run, tmp_path):
  """Features in a file (a spilled or run.cache_dir cache) train from rows read per batch,
  never copied whole to the device (host memory holds a batch), and give the same probes
  bit for bit: the group of three seeds, one probe alone (its own step and eval), and one
  on eight devices (batches gathered on the host)."""
  _, encoder, mesh, ftr, _ = cached_small
  on_file = [features.compute(encoder, d, mesh, 16, str(tmp_path / f"{s}.npy"))
             for d, s in ((small[1], "train"), (small[2], "eval"))]
  assert on_file[0].path and fitting.feature_table(on_file[0], mesh).table is None
  rows = on_file[0].rows(np.array([5, 0, 79, 5]))
  np.testing.assert_array_equal(rows["features"].view(np.uint16),
                                np.asarray(ftr.features)[[5, 0, 79, 5]].view(np.uint16))
  read = []
  real_rows = features.Features.rows
  with mock.patch.object(features.Features, "rows",
                         lambda self, idx: read.append(len(idx)) or real_rows(self, idx)):
    streamed = fitting.fit_many(*_fit_args(minilm, cached_small, SEEDS, tmp_path, "f",
                                           on_file))
    alone = fitting.fit_many(*_fit_args(minilm, cached_small, SEEDS[:1], tmp_path, "a",
                                        on_file))
  assert max(read) == 3 * 16 and sum(read) > 3 * 3 * 80  # Batches, every epoch, every seed.
  want_alone = fitting.fit_many(*_fit_args(minilm, cached_small, SEEDS[:1], tmp_path, "m"))
  # On eight devices each process gathers its batches on the host: from the file, rows read.
  mesh8 = parallel.make_mesh(-1)
  host = [features.compute(encoder, d, mesh8, 16, p) for d, p in (
      (small[1], ""), (small[2], ""), (small[1], str(tmp_path / "t8.npy")),
      (small[2], str(tmp_path / "e8.npy")))]
  wide = lambda splits, tag: fitting.fit_many(*(_fit_args(  # noqa: E731
      minilm, cached_small, SEEDS[:1], tmp_path, tag, splits)[:-1] + (mesh8,)))
  read.clear()
  with mock.patch.object(features.Features, "rows",
                         lambda self, idx: read.append(len(idx)) or real_rows(self, idx)):
    on_eight = wide(host[2:], "w8")
  assert read and not fitting.vectorisable(host[2], mesh8)
  for (s1, h1, l1), (s2, h2, l2) in zip(streamed + alone + on_eight,
                                        group_run + want_alone + wide(host[:2], "m8")):
    assert [dict(h, seconds=0) for h in h1] == [dict(h, seconds=0) for h in h2]
    np.testing.assert_array_equal(l1, l2)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _stop_mid_epoch_2(args, monkeypatch):
  """Runs `fit_many(*args)` until it stops at step 3 of epoch 2; checks it landed there."""
  calls = iter(range(10_000))
  monkeypatch.setattr(fitting.preemption, "should_stop", lambda: next(calls) == 5 + 2)
  with pytest.raises(fitting.preemption.Preempted, match=r"^t: stopped at step 3 of epoch 2"):
    fitting.fit_many(*args)
  for cfg in args[4]:  # Landed mid-work: a checkpoint at step 3 of epoch 2, nothing after.
    ckpt = fitting.ckpt_lib.Checkpointer(cfg.checkpoint_dir)
    assert ckpt.latest_step() == 5 + 3
    ckpt.close()
  monkeypatch.setattr(fitting.preemption, "should_stop", lambda: False)


@pytest.mark.integration
def test_a_stopped_group_resumes_to_the_same_probes(minilm, cached_small, group_run,
                                                    tmp_path, monkeypatch):
  """Stopped mid-epoch 2 and rerun, the group equals the uninterrupted one bit for bit."""
  args = _fit_args(minilm, cached_small, SEEDS, tmp_path, "r")
  _stop_mid_epoch_2(args, monkeypatch)
  for (s1, h1, l1), (s2, h2, l2) in zip(fitting.fit_many(*args), group_run):
    assert [h["accuracy"] for h in h1] == [h["accuracy"] for h in h2]
    assert [h["train_loss"] for h in h1] == [h["train_loss"] for h in h2]
    np.testing.assert_array_equal(l1, l2)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.integration
def test_probes_at_different_points_resume_in_groups(minilm, cached_small, group_run,
                                                     tmp_path, monkeypatch):
  """Two seeds stopped mid-epoch 2 and a third never started: the rerun resumes the two
  together and trains the third from its start, each equal to the uninterrupted group's
  (up to the group size's float reassociation)."""
  args = _fit_args(minilm, cached_small, SEEDS, tmp_path, "p")
  first = list(args)
  first[4] = args[4][:2]
  _stop_mid_epoch_2(first, monkeypatch)
  assert not (tmp_path / "p44").exists()
  restored = []
  real = fitting.ckpt_lib.Checkpointer.restore
  monkeypatch.setattr(fitting.ckpt_lib.Checkpointer, "restore",
                      lambda self, *a, **k: restored.append(self.directory) or real(self, *a, **k))
  for one, together in zip(fitting.fit_many(*args), group_run):
    _assert_same(one, together)
  assert sorted(restored) == [str(tmp_path / "p42"), str(tmp_path / "p43")]  # Once each.


@pytest.mark.integration
def test_rows_fill_a_device_array_on_one_device_and_a_host_array_elsewhere():
  """`parallel.Rows`: the same rows either way; on one device no host copy exists."""
  rows = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)
  for n_dev, on_device in ((1, True), (len(jax.devices()), len(jax.devices()) == 1)):
    buf = parallel.Rows(5, (3,), "bfloat16", parallel.make_mesh(n_dev))
    assert buf.on_device == on_device
    buf.add(rows[:2])
    buf.add(rows[2:])
    assert isinstance(buf.data, jax.Array) == on_device
    np.testing.assert_array_equal(np.asarray(buf.data, np.float32), rows)


@pytest.fixture(scope="module")
def cached_ner(minilm, minilm_tokenizer):
  """Real MiniLM features of 64 CoNLL-2003 train and 48 dev sentences (64 positions)."""
  task = tasks.get_task("ner")
  d = str(require_shared("data", "conll2003"))
  enc = lambda split, n: preprocess.encode(
      task, list(readers.read_split(task, d, split))[:n], minilm_tokenizer, 64)
  encoder = train.FrozenEncoder(minilm.params, None, minilm.config, feature_dtype="bfloat16")
  mesh = parallel.make_mesh(1)
  return (task, encoder, mesh, features.compute(encoder, enc("train", 64), mesh, 16),
          features.compute(encoder, enc("validation", 48), mesh, 16))


@pytest.mark.integration
def test_scored_widths_cover_every_scored_position(cached_ner):
  labels = np.asarray(cached_ner[4].labels)
  widths = fitting.scored_widths(labels)
  for row, w in zip(labels, widths):  # Oracle: a loop over each row's positions.
    last = max([t + 1 for t in range(len(row)) if row[t] != preprocess.IGNORE], default=0)
    assert w == min(64, max(8, -(-last // 8) * 8))
  assert len(set(widths)) > 1 and widths.max() <= 64  # Real sentences differ in length.
  assert fitting.scored_widths(np.full((2, 20), preprocess.IGNORE)).tolist() == [8, 8]


@pytest.mark.integration
def test_per_token_eval_on_cut_batches_equals_full_width(minilm, cached_ner):
  """Tagging probes trained together, evaluated on batches cut to their scored positions
  (as `fit_many` does), give the full-width logits at every scored position; a sentence
  probe is never cut."""
  task, encoder, mesh, ftr, fev = cached_ner
  cfgs = [train.FitConfig(epochs=2, batch_size=16, eval_batch_size=16, seed=s) for s in SEEDS]
  probe = probes.TokenProbe(len(task.label_names), minilm.config.hidden_size)
  runs = fitting.fit_many("t", probe, encoder, train.make_optimizer(optimizer_config()), cfgs,
                          ftr, fev, lambda lg: metrics.task_scores(task, lg, fev.labels), mesh)
  params = jax.tree.map(lambda *x: np.stack(x), *[s.params for s, _, _ in runs])
  step = train.make_eval_step(probe)
  eval_fn = jax.jit(lambda p, b: jax.vmap(lambda q: step(q, b, None))(p))
  table = fitting.feature_table(fev, mesh)
  full = fitting._group_predict(eval_fn, params, table, 16)
  labels = np.asarray(fev.labels)
  keep = labels != preprocess.IGNORE
  widths = fitting.scored_widths(labels)
  assert widths.mean() < 40  # The cut saves work on these sentences.
  for (_, history, cut), want in zip(runs, full):
    assert cut.shape == want.shape == labels.shape + (len(task.label_names),)
    np.testing.assert_allclose(cut[keep], want[keep], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(cut[keep].argmax(-1), want[keep].argmax(-1))
    assert history[-1] == dict(history[-1], **metrics.task_scores(task, want, labels))
  assert not np.allclose(full[0][keep], full[1][keep], atol=1e-3)  # Seeds differ.
  assert fitting._widths(probes.SentenceProbe(2, 8, 0.1), fev) is None
  # One probe alone (its own jitted step and eval) takes the same cut.
  state, _, cut = fitting.fit("t", probe, encoder, train.make_optimizer(optimizer_config()),
                              cfgs[0], ftr, fev, lambda lg: {}, mesh)
  want = fitting._group_predict(lambda p, b: step(p, b, None)[None], state.params, table, 16)
  np.testing.assert_allclose(cut[keep], want[0][keep], rtol=1e-6, atol=1e-6)


@pytest.mark.integration
def test_disk_cache_files_go_once_their_head_sets_probes_are_trained(tmp_path):
  """With run.cache_dir, each static-head set's .npy files are removed after its probes (a
  full train split's features need tens of GB per set); the scores equal the in-memory run.
  So do they where the features exceed run.cache_memory_gb (0 here) with no cache_dir: they
  go to a temporary folder instead of memory, and the means pass keeps none of its own."""
  from papa_jax import run  # pylint: disable=import-outside-toplevel
  from tests.testing import require_model, tiny_config  # pylint: disable=import-outside-toplevel
  require_model("splade_tiny")
  scores, kept = {}, {}
  real_accumulate = means_lib.accumulate

  def accumulate(*args, **kwargs):
    kept[name] = kwargs.get("feature_dtype") is not None
    return real_accumulate(*args, **kwargs)

  for name, cache, memory_gb in (("memory", "", 4.0), ("dir", str(tmp_path / "cache"), 4.0),
                                 ("spilled", "", 0.0)):
    c = tiny_config(tmp_path, **{"model.name": "splade_tiny", "probe.cache_features": True,
                                 "probe.encoder_dropout": False, "papa.fractions": (0.0, 1.0),
                                 "run.cache_dir": cache, "run.cache_memory_gb": memory_gb})
    with mock.patch.object(means_lib, "accumulate", accumulate):
      rows = run.run(c, str(tmp_path / f"wd_{name}"))
    scores[name] = [(r["static_heads"], r["score"]) for r in rows]
  assert scores["memory"] == scores["dir"] == scores["spilled"]
  assert kept == {"memory": True, "dir": False, "spilled": False}
  assert os.path.isdir(tmp_path / "cache") and not os.listdir(tmp_path / "cache")
  spill = features.cache_folder("", 1, 0.0)  # This process's temporary folder.
  assert spill.startswith(tempfile.gettempdir()) and os.path.isdir(spill)
  assert not os.listdir(spill)  # Each set's files went once its probes were trained.


@pytest.mark.unit
def test_cache_folder_memory_until_the_budget_then_one_temporary_folder():
  assert features.cache_folder("/c", 10 * 2**30, 4.0) == "/c"
  assert features.cache_folder("", 4 * 2**30, 4.0) == ""
  spill = features.cache_folder("", 4 * 2**30 + 1, 4.0)
  assert spill and os.path.isdir(spill) and features.cache_folder("", 2**40, 1.0) == spill
