"""Attention knockout (Geva et al. 2023): blocked edges over a window of layers, against a
float64 numpy layer, a loop over its targets, and one compile for every target."""

import chex
import jax
import numpy as np
import pytest

import papa_jax as pj
from papa_jax import interventions
from tests import testing

SENTS = ["the movie was a gorgeous , witty , seductive thing .", "dull",
         "a film that proves its point a little too well"]
L = 16


@pytest.fixture(scope="module")
def batch(minilm_tokenizer):
  enc = minilm_tokenizer(SENTS, padding="max_length", max_length=L, truncation=True,
                         return_tensors="np")
  return enc["input_ids"], enc["attention_mask"]


def _f64(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def _classes(tok, ids, mask):
  punct = tuple(tok.convert_tokens_to_ids([",", "."]))
  return interventions.position_classes(ids, mask, cls_id=tok.cls_token_id,
                                        sep_ids=(tok.sep_token_id,), punctuation_ids=punct)


@pytest.mark.integration
@pytest.mark.parametrize("rule", interventions.KNOCKOUT_RULES)
def test_knockout_equals_a_numpy_layer_with_those_edges_removed(minilm, minilm_tokenizer, batch,
                                                                 rule):
  """Every query's edges to [CLS] and punctuation blocked in layer 1 of example 0 (example 1
  in no layer, example 2 only its edges to the next token): layer 1's output equals a float64
  BERT layer whose probabilities lose those edges (renormalised or not); layers outside the
  window and example 1 are untouched."""
  ids, mask = batch
  c = minilm.config
  cls = _classes(minilm_tokenizer, ids, mask)
  assert cls["punctuation"][0].sum() == 3 and cls["cls"][:, 0].all()
  blocked = np.array(interventions.edges(mask, cls["cls"] | cls["punctuation"]))
  blocked[2] = np.asarray(interventions.shifted_edges(mask, +1))[2]
  ko = pj.Knockout(blocked, [1, -1, 1], [1, -1, 1], rule=rule)
  out = minilm.apply(ids, mask, override=pj.AttentionOverride.intervene(ko))
  stock = minilm.apply(ids, mask)
  p = _f64(minilm.params["layer_1"])
  x = np.asarray(out.hidden_states[1], np.float64)
  m = mask.astype(np.float64)
  probs = testing.np_softmax_probs(x, m, p["attention"], list(range(c.num_heads)),
                                   c.dim_per_head)
  cut = blocked[:, None] & np.array([True, False, True])[:, None, None, None]
  knocked = np.where(cut, 0.0, probs)
  if rule == "renormalize":
    lost = cut.any(-1, keepdims=True)
    knocked = np.where(lost, knocked / knocked.sum(-1, keepdims=True), probs)
  want = testing.np_bert_layer(x, knocked, p, c.layer_norm_eps)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out.hidden_states[2])[real], want[real], atol=3e-5)
  for k in (0, 1):  # Before the window: the stock run's states.
    np.testing.assert_array_equal(np.asarray(out.hidden_states[k]),
                                  np.asarray(stock.hidden_states[k]))
  np.testing.assert_allclose(np.asarray(out.last_hidden_state)[1],
                             np.asarray(stock.last_hidden_state)[1], atol=1e-6)
  assert np.abs(np.asarray(out.last_hidden_state)[0] -
                np.asarray(stock.last_hidden_state)[0]).max() > 1e-3


@pytest.mark.integration
def test_knockout_sweep_in_one_batch_equals_a_loop_and_compiles_once(minilm, minilm_tokenizer,
                                                                     batch):
  """Rows of one batch knocking out different classes over different windows equal each
  knockout run alone; new targets are traced data (one program)."""
  ids, mask = batch
  cls = _classes(minilm_tokenizer, ids, mask)
  targets = [(cls["cls"], 0, 5), (cls["sep"], 2, 3), (cls["other"], 4, 5)]
  rows = np.arange(3)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def run(ko):
    return pj.Encoder(minilm.config).apply({"params": minilm.params}, ids, mask,
                                           override=pj.AttentionOverride.intervene(ko)
                                           ).last_hidden_state

  blocked = np.stack([np.asarray(interventions.edges(mask, k))[b]
                      for b, (k, _, _) in zip(rows, targets)])
  swept = np.asarray(run(pj.Knockout(blocked, [t[1] for t in targets], [t[2] for t in targets])))
  for b, (keys, first, last) in zip(rows, targets):
    alone = np.asarray(run(pj.Knockout(np.asarray(interventions.edges(mask, keys)),
                                       [first] * 3, [last] * 3)))
    np.testing.assert_allclose(swept[b], alone[b], atol=1e-6)


@pytest.mark.unit
def test_knockout_rows_without_a_blocked_edge_are_untouched_and_bad_input_is_named():
  rng = np.random.default_rng(0)
  x = rng.random((2, 3, 4, 4)).astype(np.float32)
  x /= x.sum(-1, keepdims=True)
  blocked = np.zeros((2, 4, 4), bool)
  blocked[0, 1, 2] = True
  blocked[0, 3] = True  # Every key of query 3: that row attends to nothing.
  got = np.asarray(pj.Knockout(blocked, [0, 0], [0, 0])(x, layer=0, mask=None, values=None))
  np.testing.assert_array_equal(got[1], x[1])
  np.testing.assert_array_equal(got[0, :, [0, 2]], x[0, :, [0, 2]])
  np.testing.assert_allclose(got[0, :, 1].sum(-1), 1.0, rtol=1e-6)
  assert got[0, :, 1, 2].max() == 0 and got[0, :, 3].max() == 0
  zero = np.asarray(pj.Knockout(blocked, [0, 0], [0, 0], rule="zero")(x, layer=0, mask=None,
                                                                     values=None))
  np.testing.assert_array_equal(zero[0, :, 1, [0, 1, 3]], x[0, :, 1, [0, 1, 3]])
  outside = np.asarray(pj.Knockout(blocked, [1, 1], [2, 2])(x, layer=0, mask=None, values=None))
  np.testing.assert_array_equal(outside, x)
  with pytest.raises(ValueError, match="knockout rule 'drop'"):
    pj.Knockout(blocked, [0], [0], rule="drop")
  with pytest.raises(ValueError, match=r"Knockout.blocked has shape \(2, 4, 4\); expected "
                                       r"\[batch, L, L\] = \(2, 8, 8\)"):
    pj.AttentionOverride.intervene(pj.Knockout(blocked, [0, 0], [0, 0])).validate(
        2, 3, 8, batch=2)


@pytest.mark.unit
def test_position_classes_and_shifted_edges():
  ids = np.array([[101, 7, 1010, 8, 102, 0]])
  mask = np.array([[1, 1, 1, 1, 1, 0]])
  got = interventions.position_classes(ids, mask, cls_id=101, sep_ids=(102,),
                                       punctuation_ids=(1010,))
  assert {k: np.flatnonzero(v[0]).tolist() for k, v in got.items()} == {
      "cls": [0], "sep": [4], "punctuation": [2], "other": [1, 3]}
  prev = np.asarray(interventions.shifted_edges(mask, -1))[0]
  assert [tuple(e) for e in np.argwhere(prev)] == [(1, 0), (2, 1), (3, 2), (4, 3)]
