"""The MLM head read from *ForMaskedLM checkpoints against Hugging Face's logits, and the
logit-difference metric."""

import numpy as np
import pytest

import papa_jax as pj
from papa_jax.causal import metrics
from papa_jax.errors import ModelFileError
from tests import hf_oracle

MASKED_LM = {"bert": ("BertConfig", "BertForMaskedLM"),
             "roberta": ("RobertaConfig", "RobertaForMaskedLM"),
             "mpnet": ("MPNetConfig", "MPNetForMaskedLM"),
             "distilbert": ("DistilBertConfig", "DistilBertForMaskedLM")}


def _save_masked_lm(kind: str, path, act: str = "gelu"):
  """A tiny random *ForMaskedLM (every parameter perturbed, so LayerNorm and biases count),
  saved as safetensors; the torch model, eval mode."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers as tr  # pylint: disable=import-outside-toplevel
  config_cls, model_cls = MASKED_LM[kind]
  common = dict(hf_oracle.COMMON)
  if kind == "distilbert":
    common = dict(vocab_size=120, dim=64, n_layers=3, n_heads=4, hidden_dim=96,
                  max_position_embeddings=128, activation=act)
  else:
    common["hidden_act"] = act
  torch.manual_seed(0)
  model = getattr(tr, model_cls)(getattr(tr, config_cls)(**common)).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  model.save_pretrained(str(path), safe_serialization=True)
  return model


@pytest.mark.unit
@pytest.mark.parametrize("kind,act", [("bert", "gelu"), ("roberta", "gelu"),
                                      ("mpnet", "gelu_new"), ("distilbert", "gelu")])
def test_mlm_head_logits_equal_hugging_face(kind, act, tmp_path):
  """Our encoder, then the head read from the checkpoint, equals HF's *ForMaskedLM logits at
  every real token (float32); the logit-difference metric at each example's [MASK] equals
  HF's, and an example without one gives NaN."""
  import torch  # pylint: disable=import-outside-toplevel
  hf = _save_masked_lm(kind, tmp_path, act)
  model = pj.load_pretrained(str(tmp_path))
  head = metrics.mlm_head(model)
  ids, mask = hf_oracle.padded_batch(120, (9, 7, 4), 9, hf.config.pad_token_id or 0)
  ids[0, 3] = ids[1, 5] = 7  # Token 7 plays [MASK] in examples 0 and 1.
  ids[2][ids[2] == 7] = 8
  with torch.no_grad():
    want = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  out = model.apply(ids, mask)
  got = np.asarray(head.logits(out.hidden_states[-1]))
  real = mask.astype(bool)
  np.testing.assert_allclose(got[real], want[real], atol=2e-4 * np.abs(want).max())
  metric = metrics.logit_difference(head, 11, 12, position=None, mask_id=7)
  diff = np.asarray(metric(out, dict(input_ids=ids)))
  np.testing.assert_allclose(diff[:2], [want[0, 3, 11] - want[0, 3, 12],
                                        want[1, 5, 11] - want[1, 5, 12]], atol=1e-4)
  assert np.isnan(diff[2])
  at_cls = np.asarray(metrics.logit_difference(head, 11, 12)(out, dict(input_ids=ids)))
  np.testing.assert_allclose(at_cls, want[:, 0, 11] - want[:, 0, 12], atol=1e-4)


@pytest.mark.integration
def test_splade_tiny_head_equals_hugging_face():
  """SPLADE-tiny (a BertForMaskedLM, old LayerNorm names gamma/beta, tied decoder)."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers as tr  # pylint: disable=import-outside-toplevel
  from tests.testing import require_model  # pylint: disable=import-outside-toplevel
  require_model("splade_tiny")
  model = pj.load_pretrained("splade_tiny")
  head = metrics.mlm_head(model)
  tok = model.tokenizer()
  enc = tok(["the movie was [MASK] .", "a [MASK] film"], padding=True, return_tensors="np")
  hf = tr.BertForMaskedLM.from_pretrained(model.model_dir).eval()
  with torch.no_grad():
    want = hf(input_ids=torch.tensor(enc["input_ids"]),
              attention_mask=torch.tensor(enc["attention_mask"])).logits.numpy()
  got = np.asarray(head.logits(model.apply(enc["input_ids"], enc["attention_mask"])
                               .hidden_states[-1]))
  real = enc["attention_mask"].astype(bool)
  np.testing.assert_allclose(got[real], want[real], atol=1e-4 * np.abs(want).max())


@pytest.mark.unit
def test_every_family_with_a_head_is_tested():
  from papa_jax.convert.families import FAMILIES  # pylint: disable=import-outside-toplevel
  assert set(MASKED_LM) == {f.name for f in FAMILIES if f.mlm_head}


@pytest.mark.unit
def test_mlm_head_names_a_checkpoint_without_one_and_other_families(tmp_path, random_hf):
  path, _ = random_hf("bert")  # A BertModel checkpoint: no head.
  with pytest.raises(ModelFileError, match=r"has no MLM head \(cls.predictions.transform.dense"
                                           r".weight is missing"):
    metrics.mlm_head(str(path))
  path, _ = random_hf("deberta")
  with pytest.raises(ModelFileError, match=r"MLM heads are read for \['bert', 'camembert', "
                                           r"'distilbert', 'mpnet', 'roberta', 'xlm-roberta'\]; "
                                           r"this is 'deberta'"):
    metrics.mlm_head(str(path))
  with pytest.raises(ValueError, match="give a position"):
    metrics.logit_difference(None, 1, 2, position=None)


@pytest.mark.integration
def test_a_finished_workdirs_probe_as_a_metric_equals_its_saved_dev_logits(tmp_path):
  """`restore_baseline` brings back the baseline probe of a finished run: through
  `probe_logit_difference` on the unmodified encoder it gives the run's saved dev logits
  (class 1 - class 0), and `probe_loss` their cross-entropy; an unknown seed is named."""
  import os  # pylint: disable=import-outside-toplevel
  from papa_jax import run  # pylint: disable=import-outside-toplevel
  from papa_jax.papa import probe  # pylint: disable=import-outside-toplevel
  from tests.testing import require_model, tiny_config  # pylint: disable=import-outside-toplevel
  require_model("splade_tiny")
  wd = str(tmp_path / "wd")
  run.run(tiny_config(tmp_path, **{"model.name": "splade_tiny", "papa.fractions": (0.0,),
                                   "papa.seeds": (42, 43)}), wd)
  module, params, setup = probe.restore_baseline(wd, seed=43)
  data = setup.eval_data
  batch = dict(input_ids=data.input_ids, attention_mask=data.attention_mask,
               token_type_ids=data.token_type_ids, labels=data.labels)
  out = setup.model.apply(data.input_ids, data.attention_mask,
                          token_type_ids=data.token_type_ids)
  saved = np.load(os.path.join(wd, "probe", "raw_k0_s43", "predictions.npz"))["logits"]
  got = np.asarray(metrics.probe_logit_difference(module, params, 1, 0)(out, batch))
  np.testing.assert_allclose(got, saved[:, 1] - saved[:, 0], atol=1e-4)
  shifted = saved - saved.max(1, keepdims=True)
  want = -(shifted[np.arange(len(saved)), data.labels] - np.log(np.exp(shifted).sum(1)))
  np.testing.assert_allclose(np.asarray(metrics.probe_loss(module, params)(out, batch)), want,
                             atol=1e-4)
  other = probe.restore_baseline(wd, seed=42)[1]
  assert np.abs(np.asarray(metrics.probe_logit_difference(module, other, 1, 0)(out, batch))
                - got).max() > 1e-3  # Another seed, another probe.
  with pytest.raises(ValueError, match=r"seed 7: .* trained probes with seeds \(42, 43\)"):
    probe.restore_baseline(wd, seed=7)
  from papa_jax.errors import IncompleteWorkdir  # pylint: disable=import-outside-toplevel
  with pytest.raises(IncompleteWorkdir, match="config.json does not exist"):
    probe.restore_baseline(str(tmp_path / "nothing"))


@pytest.mark.unit
def test_probes_of_one_shape_share_each_sweeps_program(random_hf):
  """Two probes' metrics (other weights, one shape: one per seed) compile each jitted sweep
  once, and each gives its own probe's numbers (equal to the same metric as a plain function,
  which compiles its own)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from papa_jax.causal import knockout, patching  # pylint: disable=import-outside-toplevel
  from papa_jax.probing import probes  # pylint: disable=import-outside-toplevel
  model = random_hf("bert")[1]
  c = model.config
  ids, mask = hf_oracle.padded_batch(c.vocab_size, (7, 5), 7, c.pad_token_id, 0)
  batch = dict(input_ids=np.asarray(ids, np.int32), attention_mask=np.asarray(mask, np.int32))
  module = probes.make_probe("classification", 3, c.hidden_size, 0.0)
  feats = jnp.zeros((2, c.num_layers + 1, 7, c.hidden_size))
  params = [module.init(jax.random.PRNGKey(s), feats, batch["attention_mask"],
                        deterministic=True)["params"] for s in (0, 1)]
  zero = np.zeros((c.num_layers, 2, 7, c.hidden_size), np.float32)
  targets = pj.Targets(np.array([1, 1]), np.array([1, 3]), np.array([-1, -1]))
  blocked = np.zeros((2, 2, 7, 7), bool)
  blocked[1, :, :, 0] = True  # Every query's edge to [CLS].
  jitted = (patching._patched, knockout._knocked, patching._metric)  # pylint: disable=protected-access
  runs, sizes = [], []
  for p in params:
    metric = metrics.probe_logit_difference(module, p, 2, 0)
    runs.append((patching.sweep(model, batch, zero, "residual_out", targets, metric),
                 knockout.sweep(model, batch, blocked, [(1, 1)], metric),
                 patching.run_metric(model, batch, metric)))
    sizes.append([f._cache_size() for f in jitted])  # pylint: disable=protected-access
  assert sizes[0] == sizes[1], sizes
  plain = lambda out, b: metrics.probe_logit_difference(module, params[1], 2, 0)(out, b)
  want = (patching.sweep(model, batch, zero, "residual_out", targets, plain),
          patching.run_metric(model, batch, plain))
  for got, expected in zip(runs[1][::2], want):
    np.testing.assert_allclose(got, expected, atol=1e-6)
  for got, other in zip(runs[1], runs[0]):
    assert np.abs(got - other).max() > 1e-4  # Another probe, other numbers.
