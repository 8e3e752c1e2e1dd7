"""Sun & Marasovic's other analyses: fine-tuning change, linguistic features, head ablation."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import papa_jax as pj
from papa_jax import convert, parallel, preemption, run
from papa_jax.probing import probes
from papa_jax.analysis import ablation, finetune, linguistic
from papa_jax.data import preprocess, tasks
from tests import testing
from tests.testing import require_shared, tiny_config


@pytest.fixture(scope="module")
def dev(minilm_tokenizer, sst2_dir):
  return testing.sst2_dev_sample(minilm_tokenizer, sst2_dir, longest=4, first=4)


@pytest.mark.integration
def test_finetune_model_with_itself_is_cosine_one_and_js_zero(minilm, dev):
  st = testing.analysis_means(finetune.Finetune("itself"), minilm, dev.arrays(),
                              params=(minilm.params, minilm.params))
  assert st["count"] == 8
  np.testing.assert_allclose(st["cos_raw"], 1.0, atol=1e-6)
  np.testing.assert_allclose(st["cos_eff"], 1.0, atol=1e-6)
  np.testing.assert_allclose(st["js_raw"], 0.0, atol=1e-7)


@pytest.mark.integration
def test_finetune_fine_tuned_model_differs_and_mismatches_are_refused(minilm, dev, tmp_path):
  pytest.importorskip("sre_embedding_model")
  other = convert.load_pretrained("pkg:sre_embedding_model/model_weights")
  st = testing.analysis_means(finetune.Finetune("sre"), minilm, dev.arrays(),
                              params=(minilm.params, other.params))
  assert 0.5 < st["cos_raw"].min() < 1.0 and st["js_raw"].max() > 1e-6
  tiny = convert.load_pretrained(str(require_shared("fixtures", "tiny-random", "bert",
                                                    "BertModel")))
  with pytest.raises(finetune.ArchitectureMismatch, match="num_layers: 6 vs"):
    finetune.check_comparable(minilm.config, tiny.config, None)
  from papa_jax import tokenization
  same = tokenization.tokenization_difference(minilm.tokenizer(), other.tokenizer())
  assert same is None  # Differently serialised files, the same tokenizer.
  finetune.check_comparable(minilm.config, other.config, same)
  with pytest.raises(finetune.ArchitectureMismatch, match="tokenizers differ"):
    finetune.check_comparable(minilm.config, other.config, "their vocabularies differ")


@pytest.mark.integration
def test_linguistic_tags_align_to_first_word_pieces(minilm_tokenizer):
  """Hand-checked: 'unhappiness' and 'Smiths' split into pieces; only the first is tagged."""
  task = tasks.get_task("pos")
  names = list(task.label_names)
  words = ["The", "unhappiness", "Smiths", "ran", "home", "."]
  tags = ["DT", "NN", "NNPS", "VBD", "NN", "."]
  rec = dict(idx=0, tokens=words, tags=[names.index(t) for t in tags])
  enc = preprocess.encode(task, [rec], minilm_tokenizer, 16, papa_layout=False)
  pieces = minilm_tokenizer.convert_ids_to_tokens(enc.input_ids[0][enc.attention_mask[0] > 0])
  assert pieces == ["[CLS]", "the", "un", "##ha", "##pp", "##iness", "smith", "##s", "ran",
                    "home", ".", "[SEP]"]
  cls = linguistic.class_ids(enc.input_ids, enc.attention_mask, enc.labels, names,
                             minilm_tokenizer.cls_token_id, minilm_tokenizer.sep_token_id)
  got = [linguistic.CLASSES[c] for c in cls[0][enc.attention_mask[0] > 0]]
  assert got == ["CLS", "OTHER", "NOUN", "OTHER", "OTHER", "OTHER", "PROPN", "OTHER", "VERB",
                 "NOUN", "PUNCT", "SEP"]
  assert (cls[0][enc.attention_mask[0] == 0] == linguistic.PAD).all()
  assert [linguistic.tag_class(t) for t in ("NOUN", "AUX", "MD", "PRP$", "``", "$")] == [
      "NOUN", "OTHER", "OTHER", "PRON", "PUNCT", "OTHER"]


@pytest.mark.integration
def test_linguistic_stats_equal_numpy_on_one_example(minilm, minilm_tokenizer):
  task = tasks.get_task("pos")
  names = list(task.label_names)
  rec = dict(idx=0, tokens=["She", "saw", "the", "dogs", "."],
             tags=[names.index(t) for t in ("PRP", "VBD", "DT", "NNS", ".")])
  enc = preprocess.encode(task, [rec], minilm_tokenizer, 16, papa_layout=False)
  cls = linguistic.class_ids(enc.input_ids, enc.attention_mask, enc.labels, names,
                             minilm_tokenizer.cls_token_id, minilm_tokenizer.sep_token_id)
  st = testing.analysis_means(linguistic.Linguistic(), minilm, dict(enc.arrays(), classes=cls))
  a = np.asarray(minilm.apply(enc.input_ids, enc.attention_mask,
                              capture_attention=True).attentions[2][0], np.float64)
  real = enc.attention_mask[0] > 0
  for c, name in enumerate(linguistic.CLASSES):
    keys = cls[0] == c
    if not keys.any():
      assert np.isnan(st["cls_mass_raw"][2, :, c]).all()
      continue
    np.testing.assert_allclose(st["cls_mass_raw"][2, :, c], a[:, 0, keys].sum(-1), atol=1e-5)
    np.testing.assert_allclose(st["cls_max_raw"][2, :, c], a[:, 0, keys].max(-1), atol=1e-5)
    rows = a[:, real][:, :, keys].sum(-1).mean(-1)
    np.testing.assert_allclose(st["rows_mass_raw"][2, :, c], rows, atol=1e-5, err_msg=name)
  # 5 real tokens plus [CLS]/[SEP] <= head dimension: effective attention equals raw.
  np.testing.assert_allclose(st["rows_mass_eff"], st["rows_mass_raw"], atol=1e-4)


@pytest.mark.integration
def test_ablation_own_attention_changes_nothing_and_uniform_equals_numpy(minilm, dev):
  cfg = minilm.config
  ids, mask = dev.input_ids[:1], dev.attention_mask[:1]
  stock = minilm.apply(ids, mask, capture_attention=True)
  own = jnp.stack([a[0] for a in stock.attentions])  # The example's own attention.
  H = cfg.num_heads
  rep = lambda x: np.repeat(x, H, 0)
  real = mask[0] > 0
  out = minilm.apply(rep(ids), rep(mask), override=pj.AttentionOverride.intervene(
      pj.HeadAblation(np.full(H, 3), np.arange(H), own, kind="constant")))
  for a, b in zip(out.hidden_states, stock.hidden_states):
    np.testing.assert_allclose(np.asarray(a)[:, real], np.broadcast_to(
        np.asarray(b)[:, real], np.asarray(a)[:, real].shape), atol=2e-5)
  # Uniform attention on head 5 of layer 0 against a float64 numpy layer.
  out = minilm.apply(ids, mask, override=pj.AttentionOverride.intervene(
      pj.HeadAblation([0], [5], kind="uniform")))
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), minilm.params["layer_0"])
  x = np.asarray(out.hidden_states[0], np.float64)
  m = mask.astype(np.float64)
  probs = testing.np_softmax_probs(x, m, p["attention"], list(range(H)), cfg.dim_per_head)
  probs[:, 5] = m[:, None, :] * m[:, :, None] / m.sum()
  want = testing.np_bert_layer(x, probs, p, cfg.layer_norm_eps)
  np.testing.assert_allclose(np.asarray(out.hidden_states[1])[0, real], want[0, real],
                             atol=3e-5)


@pytest.mark.integration
def test_ablation_batched_rows_equal_one_at_a_time_and_effective_is_output_preserving(minilm,
                                                                                      dev):
  cfg = minilm.config
  probe = probes.SentenceProbe(2, cfg.hidden_size, 0.0)
  feats = jnp.stack(minilm.apply(dev.input_ids, dev.attention_mask).hidden_states, 1)
  pp = probe.init(jax.random.key(0), feats[:1], jnp.asarray(dev.attention_mask[:1]))["params"]
  mesh = parallel.make_mesh(1)
  frozen = (minilm.params, pp, feats, None)
  layer = 2
  batched = ablation.ablate_layer(cfg, probe, "uniform", layer, frozen, dev, mesh, 16)
  assert batched.shape == (cfg.num_heads, len(dev), 2)
  fn = jax.jit(ablation.make_ablated_logits(cfg, probe, "uniform", layer))
  for h in (0, 7):
    for e in (1, 5):
      one = ablation.rows(dev, cfg.num_heads, np.array([e]))
      one = {k: v[h:h + 1] for k, v in one.items()}
      np.testing.assert_allclose(np.asarray(fn(frozen, one))[0], batched[h, e], atol=1e-5)
  stock = np.asarray(probe.apply({"params": pp}, feats, dev.attention_mask))
  eff = ablation.ablate_layer(cfg, probe, "effective", layer, frozen, dev, mesh, 16)
  np.testing.assert_allclose(eff, np.broadcast_to(stock, eff.shape), atol=1e-4)
  assert np.abs(batched - stock).max() > 1e-4  # Uniform attention does change something.


@pytest.mark.slow
def test_analysis_stages_end_to_end(tmp_path, minilm, monkeypatch):
  """finetune, linguistic and ablation stages on tiny inputs, in one workdir."""
  del minilm
  pytest.importorskip("sre_embedding_model")
  wd = str(tmp_path / "wd")
  fast = {"data.max_length": 32, "data.papa_layout": False, "effective.max_examples": 16,
          "run.batch_size": 8}
  s = run.run(tiny_config(tmp_path, stage="finetune", **fast, **{
      "finetune.other_model": "pkg:sre_embedding_model/model_weights"}), wd)
  assert s["examples"] == 16 and 0.5 < s["mean_cos_raw"] < 1
  st = json.load(open(tmp_path / "wd" / "finetune" / "stats.json"))
  assert np.asarray(st["cos_eff"]).shape == (6, 12)
  pos = tiny_config(tmp_path, stage="linguistic", **fast, **{"data.task": "pos"})
  pos.data.data_dir = str(require_shared("data", "conll2003"))
  s = run.run(pos, str(tmp_path / "pos"))
  assert s["examples_with_class"]["CLS"] == 16 and s["examples_with_class"]["NOUN"] > 0
  assert (tmp_path / "pos" / "linguistic" / "cls_mass.png").exists()
  c = tiny_config(tmp_path, stage="ablation", **fast, **{
      "ablation.kinds": ("uniform", "effective"), "probe.epochs": 1,
      "data.max_train_examples": 32, "data.max_eval_examples": 16})
  c.effective.max_examples = 12  # The analysis subset, not the PAPA eval split.
  s = run.run(c, str(tmp_path / "abl"))
  assert s["eval_examples"] == 12 and s["max_abs_change_effective"] <= 1 / 12 + 1e-9
  change = np.asarray(json.load(open(tmp_path / "abl" / "ablation" / "stats.json"))[
      "change_uniform"])
  assert change.shape == (6, 12)
  # Preempted after 3 of the 12 (replacement, layer) units, then resumed from there.
  os.remove(tmp_path / "abl" / "ablation" / "stats.json")
  calls, real, armed = [], ablation.ablate_layer, [True]

  def stop_at_fourth(*args, **kwargs):
    calls.append(args[2:4])
    if armed[0] and len(calls) == 4:
      armed[0] = False
      raise preemption.Preempted("test: SIGTERM during the fourth unit")
    return real(*args, **kwargs)
  monkeypatch.setattr(ablation, "ablate_layer", stop_at_fourth)
  with pytest.raises(preemption.Preempted):
    run.run(c, str(tmp_path / "abl"))
  with np.load(tmp_path / "abl" / "ablation" / "partial.partial.npz") as z:
    assert int(z["position"]) == 3  # Landed mid-work: three units saved.
  calls.clear()
  again = run.run(c, str(tmp_path / "abl"))
  assert calls[0] == ("uniform", 3) and len(calls) == 9  # Units 0-2 were not redone.
  for k in ("uniform", "effective"):
    assert again[f"mean_change_{k}"] == s[f"mean_change_{k}"]
  np.testing.assert_array_equal(np.asarray(json.load(open(
      tmp_path / "abl" / "ablation" / "stats.json"))["change_uniform"]), change)
