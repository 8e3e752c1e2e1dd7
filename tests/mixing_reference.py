"""Test-only PyTorch re-implementations of the reference context-mixing procedures.

Written from the published methods as the reference code runs them
(`shared/spec/context_mixing.md` §3.2, §5.2, §6.2, §7.3): one sentence at a
time, no padding, the full `[H, N, N, d]` / `[N, N, d]` vector tensors
materialised, value zeroing by re-running each layer once per zeroed token
with Hugging Face's own modules. No code is copied from those repositories.
They are the oracle of tests/mixing_test.py and the baseline of
benchmarks/mixing_bench.py.
"""

from __future__ import annotations

import numpy as np


def _parts(model, l: int) -> dict:
  """One layer's modules under common names (BERT-like and DistilBERT)."""
  if hasattr(model, "transformer"):  # DistilBERT.
    layer = model.transformer.layer[l]
    a = layer.attention
    return dict(heads=a.n_heads, value=a.v_lin, out=a.out_lin, ln1=layer.sa_layer_norm,
                ffn=lambda h: layer.ffn(h), ln2=layer.output_layer_norm)
  layer = model.encoder.layer[l]
  return dict(heads=layer.attention.self.num_attention_heads,
              value=layer.attention.self.value, out=layer.attention.output.dense,
              ln1=layer.attention.output.LayerNorm,
              ffn=lambda h: layer.output.dropout(layer.output.dense(layer.intermediate(h))),
              ln2=layer.output.LayerNorm)


def _forward(model, ids):
  import torch
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids)[None], output_hidden_states=True,
                output_attentions=True)
  return out.hidden_states, out.attentions


def _vectors(p, x, alpha):
  """The reference's per-head `[H, N, N, d]` attention vectors and pieces of one layer."""
  import torch
  n, d = x.shape
  h = p["heads"]
  v = p["value"](x).view(n, h, d // h).transpose(0, 1)  # [H, N, dh], bias included.
  w = p["out"].weight.view(d, h, d // h).permute(1, 2, 0)  # [H, dh, d]
  f = torch.einsum("hjk,hkd->hjd", v, w)  # [H, N, d]
  zh = alpha[:, :, :, None] * f[:, None, :, :]  # [H, N, N, d]: materialised, as the reference.
  z = zh.sum(0)
  res = z + torch.diag_embed(x.T).permute(1, 2, 0)  # + delta_ij x_i.
  u = x + z.sum(1) + p["out"].bias
  return zh, z, res, u


def norms(model, ids) -> dict[str, np.ndarray]:
  """Kobayashi et al.'s norms, with the residual and LN1, and GlobEnc's N-Enc and
  rollout (unnormalised, no identity): `{name: [layers, ...]}` for one sentence."""
  import torch
  hidden, attentions = _forward(model, ids)
  out = {k: [] for k in ("head", "attn", "attnres", "attnresln", "enc")}
  with torch.no_grad():
    for l, alpha in enumerate(attentions):
      p, x = _parts(model, l), hidden[l][0]
      zh, z, res, u = _vectors(p, x, alpha[0])
      ln1, ln2 = p["ln1"], p["ln2"]
      s1 = torch.sqrt(u.var(-1, unbiased=False) + ln1.eps)
      resln = (res - res.mean(-1, keepdim=True)) / s1[:, None, None] * ln1.weight
      h = ln1(u)
      r = h + p["ffn"](h)
      s2 = torch.sqrt(r.var(-1, unbiased=False) + ln2.eps)
      enc = (resln - resln.mean(-1, keepdim=True)) / s2[:, None, None] * ln2.weight
      for k, v in (("head", zh), ("attn", z), ("attnres", res), ("attnresln", resln),
                   ("enc", enc)):
        out[k].append(torch.linalg.norm(v, dim=-1).numpy())
  res = {k: np.stack(v) for k, v in out.items()}
  g, rolled = None, []
  for e in res["enc"]:
    g = e if g is None else e @ g
    rolled.append(g)
  res["globenc"] = np.stack(rolled)
  return res


def alti(model, ids) -> np.ndarray:
  """Ferrando et al.'s contributions as mt-upc's code computes them (its LN scale without
  eps, torch's pairwise L1 distance with its 1e-6 shift, "min_sum" normalisation),
  `[layers, N, N]`."""
  import torch
  hidden, attentions = _forward(model, ids)
  out = []
  with torch.no_grad():
    for l, alpha in enumerate(attentions):
      p, x = _parts(model, l), hidden[l][0]
      _, _, res, u = _vectors(p, x, alpha[0])
      ln1 = p["ln1"]
      std = (u + ln1.eps).std(-1, unbiased=False)  # The quirk: eps added to the vector.
      t = (res - res.mean(-1, keepdim=True)) / std[:, None, None] * ln1.weight
      b = p["out"].bias
      y = t.sum(1) + (b - b.mean()) / std[:, None] * ln1.weight + ln1.bias
      n = x.shape[0]
      d = torch.nn.functional.pairwise_distance(
          t.reshape(n * n, -1), y[:, None].expand(n, n, -1).reshape(n * n, -1), p=1).view(n, n)
      c = torch.clamp(y.abs().sum(-1)[:, None] - d, min=0)
      out.append((c / c.sum(-1, keepdim=True)).numpy())
  return np.stack(out)


def value_zeroing(model, ids, double: bool = True) -> np.ndarray:
  """Mohebbi et al.'s loop: every layer re-run from its clean input once per zeroed token
  (all heads' values of that token, bias included, set to 0 after the softmax), sklearn's
  cosine distance of each token's output, rows divided by their sum: `[layers, N, N]`.
  Runs in float64 (`double`): the reference's float32 `1 - cos` cancels for the small
  distances of a random model (15% off here; spec §7.4)."""
  import copy

  import torch
  from sklearn.metrics.pairwise import cosine_distances
  if double:
    model = copy.deepcopy(model).double()
  hidden, attentions = _forward(model, ids)
  out = []
  with torch.no_grad():
    for l, alpha in enumerate(attentions):
      p, x = _parts(model, l), hidden[l][0]
      n, d = x.shape
      h = p["heads"]
      v = p["value"](x).view(n, h, d // h).transpose(0, 1)
      clean = hidden[l + 1][0].numpy()
      score = np.zeros((n, n))
      for t in range(n):
        vt = v.clone()
        vt[:, t] = 0
        ctx = torch.einsum("hij,hjk->ihk", alpha[0], vt).reshape(n, d)
        hh = p["ln1"](p["out"](ctx) + x)
        zeroed = p["ln2"](hh + p["ffn"](hh)).numpy()
        score[:, t] = cosine_distances(zeroed, clean).diagonal()
      out.append(score / score.sum(-1, keepdims=True))
  return np.stack(out)
