"""ONNX exports of BERT encoders -> (`EncoderConfig`, Hugging Face-named state dict).

Weights are named by their initializer when it carries the Hugging Face name (any
prefix, e.g. `model.0.auto_model.`), else by the module path in the name of the node
that consumes them (`/…/encoder/layer.0/attention/self/query/MatMul` ->
`encoder.layer.0.attention.self.query.weight`); their layout (a MatMul's `(in, out)`,
a Transpose'd or Gemm `(out, in)`) is read from that node, never guessed from shapes.
Task heads (`cls.`, `classifier.`, ...) and the pooler are left out, as for safetensors.
The architecture comes from the graph: sizes from the weights, heads from the
attention reshapes and the score scale, the LayerNorm epsilon from its nodes (fused or
decomposed), the activation by evaluating the feed-forward activation subgraph against
ours. Quantised, fused (onnxruntime-optimised) and non-BERT graphs are refused by name.
No torch.
"""

from __future__ import annotations

import re

import numpy as np

from papa_jax.convert.onnx_graph import (INSTALL, Graph, attr, identity_outputs, load_model,
                                          own_uses, shape_tail)
from papa_jax.errors import ModelFileError
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import activation

# `prefix.` + a BERT module path (the part Hugging Face's BertModel names).
HF_PART = re.compile(r"(?:^|\.)((?:embeddings|encoder\.layer\.\d+|pooler)(?:\.\w+)*)$")
QUANTISED_OPS = {"DequantizeLinear", "QuantizeLinear", "DynamicQuantizeLinear",
                 "MatMulInteger", "QLinearMatMul", "QGemm", "QAttention", "MatMulNBits",
                 "DynamicQuantizeMatMul", "GatherBlockQuantized"}
# Module names of Hugging Face task heads: their weights are left out.
TASK_HEADS = {"cls", "classifier", "pre_classifier", "qa_outputs", "lm_head"}
FUSED_OPS = {"Attention", "MultiHeadAttention", "EmbedLayerNormalization",
             "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "FastGelu",
             "BiasGelu", "FusedMatMul", "SimplifiedLayerNormalization"}


def _hf_part(name: str) -> tuple[str, str] | None:
  """(prefix, BERT module path) of a dotted name, or None."""
  m = HF_PART.search(name)
  return (name[:m.start(1)], m.group(1)) if m else None


def _node_module(node) -> str | None:
  """`/m/encoder/layer.0/attention/self/query/MatMul` -> `encoder.layer.0.attention.self.query`."""
  parts = [p for p in node.name.split("/") if p][:-1]
  hit = _hf_part(".".join(parts)) if parts else None
  return hit[1] if hit else None


def _use_meaning(g: Graph, node, index: int) -> tuple[str, bool] | None:
  """(parameter suffix, stored as (in, out)) that one use gives a weight, or None."""
  op = node.op_type
  if op == "MatMul" and index == 1:
    return "weight", True
  if op == "Transpose" and list(attr(node, "perm", [1, 0])) == [1, 0]:
    later = g.direct_uses(node.output[0])
    if later and all(n.op_type == "MatMul" and i == 1 for n, i in later):
      return "weight", False
    return None
  if op == "Gemm" and index in (1, 2) and not attr(node, "transA", 0):
    return ("weight", not attr(node, "transB", 0)) if index == 1 else ("bias", False)
  if op == "Gather" and index == 0:
    return "weight", False
  if op == "LayerNormalization" and index in (1, 2):
    return ("weight", "bias")[index - 1], False
  if op in ("Add", "Mul"):  # Linear biases; decomposed LayerNorm scale and shift.
    return ("bias" if op == "Add" else "weight"), False
  return None


def _in_head(node) -> bool:
  """The node belongs to a task head (`/cls/predictions/…`, `/classifier/…`)."""
  return any(p in TASK_HEADS for p in node.name.split("/")[:-1])


def _shape(g: Graph, name: str) -> str:
  """The shape of a weight for a message; `name` may be an Identity of an initializer
  (exporters share equal weights so), which `g.array` does not read."""
  value = g.const(name)
  return str(list(value.shape)) if value is not None else "(shape unknown)"


def _weight_name(g: Graph, name: str) -> tuple[str, str, bool] | None:
  """(prefix, Hugging Face name, stored as (in, out)) of one weight tensor; None for a
  task head's own weight (a tied decoder still names the word embeddings)."""
  uses = [(n, i) for n, i in own_uses(g, name) if not _in_head(n)]
  if not uses:
    return None
  meanings = set()
  for node, i in uses:
    meaning = _use_meaning(g, node, i)
    if meaning is None:
      raise g.refuse(f"initializer {name!r} {_shape(g, name)} feeds a "
                     f"{node.op_type} node {node.name!r} (input {i}), which this importer "
                     "does not understand as a BERT weight.")
    module = _node_module(node)
    if module is None and node.op_type == "Transpose":
      module = _node_module(g.direct_uses(node.output[0])[0][0])
    meanings.add((module, *meaning))
  if len(meanings) > 1:
    raise g.refuse(f"initializer {name!r} is used as several different weights "
                   f"{sorted(meanings, key=str)}; cannot tell which it is.")
  module, suffix, in_out = meanings.pop()
  own = _hf_part(name)
  if own is not None:
    if module is not None and own[1] != f"{module}.{suffix}":
      raise g.refuse(f"initializer {name!r} is consumed as {module}.{suffix} (node "
                     f"{uses[0][0].name!r}): its name and its use disagree.")
    return own[0], own[1], in_out
  if module is None:
    raise g.refuse(f"initializer {name!r} {_shape(g, name)} has no Hugging Face "
                   f"name and its consumer {uses[0][0].op_type} {uses[0][0].name!r} names "
                   "no BERT module (embeddings / encoder.layer.N / pooler); cannot tell "
                   "which weight it is.")
  return "", f"{module}.{suffix}", in_out


def state_dict_from_graph(g: Graph) -> dict[str, np.ndarray]:
  """Every weight under its Hugging Face BertModel name, torch layout `(out, in)`."""
  for n in g.nodes:
    if n.op_type in QUANTISED_OPS or n.op_type in FUSED_OPS or n.domain not in ("", "ai.onnx"):
      kind = "quantised" if n.op_type in QUANTISED_OPS else "fused or custom"
      raise g.refuse(f"node {n.name!r} is a {kind} op {n.domain or 'ai.onnx'}:{n.op_type}; "
                     "only plain float exports of BERT encoders are supported (export "
                     "without quantisation or onnxruntime graph optimisation).")
    if n.op_type == "CumSum":
      raise g.refuse(f"node {n.name!r} is a CumSum: position ids counted from the padding "
                     "(RoBERTa-style); only BERT's absolute positions are supported.")
  state: dict[str, np.ndarray] = {}
  origin: dict[str, str] = {}
  prefixes = set()
  for name in g.inits:
    arr = g.array(name)
    if arr.dtype.kind in "iu" and arr.dtype.itemsize == 1:
      raise g.refuse(f"initializer {name!r} is {arr.dtype} {list(arr.shape)}: a quantised "
                     "export; only float weights are supported.")
    if arr.dtype.kind != "f" or arr.size <= 1:
      continue  # Shape constants, index buffers, scalars (scale, epsilon).
    # A shared initializer (the exporter dedupes equal tensors) names each use apart.
    names = [name] if own_uses(g, name) else []
    names += identity_outputs(g, name)
    for value_name in names:
      named = _weight_name(g, value_name)
      if named is None or named[1].startswith("pooler."):
        continue
      prefix, hf, in_out = named
      if hf in state:
        raise g.refuse(f"initializers {origin[hf]!r} and {value_name!r} both map to {hf}.")
      if prefix:
        prefixes.add(prefix)
      value = np.asarray(arr, np.float32)
      state[hf] = np.ascontiguousarray(value.T) if in_out else value
      origin[hf] = value_name
  if len(prefixes) > 1:
    raise g.refuse(f"weights carry different name prefixes {sorted(prefixes)}: more than "
                   "one model in the graph?")
  g.weight_tensors = origin
  return state


def _linear_output(g: Graph, hf_weight: str) -> list:
  """The MatMul/Gemm nodes that apply the Linear weight `hf_weight` (directly or
  through a Transpose)."""
  uses = g.direct_uses(g.weight_tensors.get(hf_weight, ""))
  uses += [u for n, _ in uses if n.op_type == "Transpose" for u in g.direct_uses(n.output[0])]
  return [n for n, i in uses if n.op_type in ("MatMul", "Gemm") and i == 1]


def _heads_from_reshapes(g: Graph, layers: int, hidden: int) -> set:
  """(heads, head dim) of every query/key/value reshape to [..., heads, head_dim]."""
  found = set()
  for i in range(layers):
    for part in ("query", "key", "value"):
      for mm in _linear_output(g, f"encoder.layer.{i}.attention.self.{part}.weight"):
        outs = [mm.output[0]] + [n.output[0] for n, _ in g.direct_uses(mm.output[0])
                                 if n.op_type == "Add"]
        for t in outs:
          for n, j in g.direct_uses(t):
            if n.op_type != "Reshape" or j != 0:
              continue
            tail = shape_tail(g, n.input[1])
            if not tail or len(tail) < 2 or None in tail[-2:]:
              continue
            h, d = tail[-2:]
            h, d = (hidden // d if h == -1 and d > 0 else h), (hidden // h if d == -1 and h > 0
                                                              else d)
            found.add((h, d))
  return found


def _head_dims_from_scale(g: Graph) -> set:
  """Head dims d from the score scale before each Softmax (a Div by sqrt(d) or a Mul
  by 1/sqrt(d) of a MatMul output)."""
  found = set()
  for sm in (n for n in g.nodes if n.op_type == "Softmax"):
    frontier, seen = [sm.input[0]], set()
    for _ in range(4):
      nxt = []
      for t in frontier:
        n = g.producer.get(t)
        if n is None or id(n) in seen:
          continue
        seen.add(id(n))
        if n.op_type in ("Div", "Mul"):
          c = g.scalar(n.input[1])
          src = g.producer.get(n.input[0])
          if c and src is not None and src.op_type == "MatMul":
            found.add(round(c * c if n.op_type == "Div" else 1 / (c * c), 3))
            continue
        nxt += [x for x in n.input if g.const(x) is None]
      frontier = nxt
  return found


def _epsilons(g: Graph) -> list[float]:
  """LayerNorm epsilons: LayerNormalization attributes, or decomposed
  ReduceMean/Pow/ReduceMean/Add(eps)/Sqrt patterns."""
  eps = [float(attr(n, "epsilon", 1e-5)) for n in g.nodes if n.op_type == "LayerNormalization"]
  for n in g.nodes:
    add = g.producer.get(n.input[0]) if n.op_type == "Sqrt" else None
    if add is None or add.op_type != "Add":
      continue
    for a, b in ((0, 1), (1, 0)):
      c, src = g.scalar(add.input[b]), g.producer.get(add.input[a])
      if c is not None and src is not None and src.op_type == "ReduceMean":
        eps.append(c)
  return [float(f"{e:.7g}") for e in eps]  # float32 attributes: 9.99999996e-13 -> 1e-12.


def _activation(g: Graph, layer: int) -> str:
  """The feed-forward activation between intermediate.dense and output.dense, found by
  running that part of the graph (onnx's reference evaluator) against each of ours."""
  from onnx import TensorProto, helper, numpy_helper  # pylint: disable=import-outside-toplevel
  from onnx.reference import ReferenceEvaluator  # pylint: disable=import-outside-toplevel
  k = f"encoder.layer.{layer}."
  start = _linear_output(g, k + "intermediate.dense.weight")
  stop = _linear_output(g, k + "output.dense.weight")
  if not start or not stop:
    raise g.refuse(f"cannot find layer {layer}'s feed-forward MatMul nodes "
                   "(intermediate.dense, output.dense) to read its activation.")
  x_name = start[0].output[0]
  adds = [n for n, _ in g.uses.get(x_name, []) if n.op_type == "Add"]
  x_name = adds[0].output[0] if len(adds) == 1 else x_name  # After the bias.
  end, seen, frontier = stop[0].input[0], set(), [x_name]
  while frontier and len(seen) < 64:
    t = frontier.pop()
    for n, _ in g.uses.get(t, []) if t != end else []:
      if n is not stop[0] and id(n) not in seen:
        seen.add(id(n))
        frontier += list(n.output)
  inside = [n for n in g.nodes if id(n) in seen]  # Graph order is topological.
  ops = sorted({n.op_type for n in inside})
  made = {o for n in inside for o in n.output} | {x_name}
  consts = {}
  for t in {t for n in inside for t in n.input if t and t not in made}:
    v = g.const(t)
    if v is None:
      raise g.refuse(f"layer {layer}'s activation ({ops}) reads {t!r}, not only its input.")
    consts[t] = numpy_helper.from_array(np.asarray(v), t)
  info = lambda t: helper.make_tensor_value_info(t, TensorProto.FLOAT, None)  # noqa: E731
  sub = helper.make_model(helper.make_graph(inside, "act", [info(x_name)], [info(end)],
                                            list(consts.values())),
                          opset_imports=g.opset_import, ir_version=8)
  x = np.linspace(-8, 8, 321, dtype=np.float32).reshape(1, 1, -1)
  try:
    y = np.asarray(ReferenceEvaluator(sub).run(None, {x_name: x})[0], np.float64)
  except Exception as e:  # An op the evaluator lacks, or a non-elementwise path.
    raise g.refuse(f"could not evaluate layer {layer}'s activation ops {ops}: {e}") from e
  found = [a for a in ("gelu", "gelu_new", "relu", "silu")
           if y.shape == x.shape and np.abs(np.asarray(activation(a)(x)) - y).max() < 1e-5]
  if not found:
    raise g.refuse(f"layer {layer}'s feed-forward activation (ops {ops}) is none of gelu, "
                   "gelu_new (tanh approximation), relu, silu.")
  return found[0]


def config_from_graph(g: Graph, state: dict[str, np.ndarray], name: str = "") -> EncoderConfig:
  """The BERT architecture that the graph computes, or an error naming what is missing."""
  def need(key: str) -> np.ndarray:
    if key not in state:
      raise g.refuse(f"no {key} in the graph (found {len(state)} BERT weights: "
                     f"{sorted(state)[:6]} ...); not a BERT encoder export?")
    return state[key]
  vocab, hidden = need("embeddings.word_embeddings.weight").shape
  max_pos = need("embeddings.position_embeddings.weight").shape[0]
  types = state.get("embeddings.token_type_embeddings.weight")
  indices = sorted({int(m.group(1)) for k in state
                    if (m := re.match(r"encoder\.layer\.(\d+)\.", k))})
  if not indices or indices != list(range(len(indices))):
    raise g.refuse(f"encoder layers {indices} are not 0..N-1: a layer's weights are missing.")
  layers = len(indices)
  intermediate = need("encoder.layer.0.intermediate.dense.weight").shape[0]
  shapes = _heads_from_reshapes(g, layers, hidden)
  dims = _head_dims_from_scale(g)
  if len(shapes) > 1 or not shapes and len(dims) != 1:
    raise g.refuse(f"cannot tell the number of heads: attention reshapes give "
                   f"{sorted(shapes)} (heads, head dim), score scales give head dims "
                   f"{sorted(dims)}.")
  heads, head_dim = shapes.pop() if shapes else (round(hidden / dims.pop()), None)
  head_dim = head_dim or hidden // heads
  if heads * head_dim != hidden or dims and dims != {float(head_dim)}:
    raise g.refuse(f"attention of {heads} heads x {head_dim} does not match hidden size "
                   f"{hidden} and score scales 1/sqrt({sorted(dims)}).")
  eps = sorted(set(_epsilons(g)))
  if len(eps) != 1:
    raise g.refuse(f"LayerNorm epsilons {eps}: expected one value "
                   f"({'none found' if not eps else 'they differ'}).")
  acts = {_activation(g, i) for i in range(layers)}
  if len(acts) != 1:
    raise g.refuse(f"layers use different activations {sorted(acts)}.")
  try:
    return EncoderConfig(
        vocab_size=int(vocab), hidden_size=int(hidden), num_layers=layers, num_heads=int(heads),
        intermediate_size=int(intermediate), max_position_embeddings=int(max_pos),
        type_vocab_size=0 if types is None else int(types.shape[0]), hidden_act=acts.pop(),
        layer_norm_eps=eps[0], family="bert", name=name)
  except ValueError as e:  # EncoderConfig's own checks of what the graph gave.
    raise g.refuse(str(e)) from None


def read_onnx(path: str, name: str = "") -> tuple[EncoderConfig, dict[str, np.ndarray]]:
  """(config, Hugging Face-named float32 state dict) of a BERT encoder's ONNX export."""
  g = Graph(load_model(path), path)
  state = state_dict_from_graph(g)
  return config_from_graph(g, state, name=name or path), state


def hidden_state_output(path_or_model) -> str:
  """The graph output that is the last hidden state [batch, tokens, hidden]: the one
  the last layer's output LayerNorm produces (exports often give it an opaque name)."""
  model = load_model(path_or_model) if isinstance(path_or_model, str) else path_or_model
  g = Graph(model, getattr(path_or_model, "name", "") or str(path_or_model)[:200])
  state = state_dict_from_graph(g)
  last = max(int(m.group(1)) for k in state if (m := re.match(r"encoder\.layer\.(\d+)\.", k)))
  bias = f"encoder.layer.{last}.output.LayerNorm.bias"  # Its consumer ends the LayerNorm.
  ends = {n.output[0] for n, _ in g.direct_uses(g.weight_tensors.get(bias, ""))}
  for out in g.outputs:
    t = out
    while t not in ends and g.producer.get(t) is not None and g.producer[t].op_type == "Identity":
      t = g.producer[t].input[0]
    if t in ends:
      return out
  raise g.refuse(f"no graph output comes from the last layer's output LayerNorm; "
                 f"outputs: {g.outputs}.")


def graph_difference(model, path: str, input_ids, attention_mask) -> float:
  """Max |our last hidden state - the ONNX graph's own (onnxruntime)| at real tokens.

  A check of a conversion against the file it came from. `model` is the loaded
  `Pretrained`; the graph may also take `token_type_ids` (fed zeros, as ours are).
  """
  try:
    import onnxruntime  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError(f"Running the ONNX graph needs onnxruntime: {INSTALL}.") from e
  ids, mask = np.asarray(input_ids, np.int64), np.asarray(attention_mask, np.int64)
  sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
  feed = {}
  for i in sess.get_inputs():
    if i.name not in ("input_ids", "attention_mask", "token_type_ids"):
      raise ModelFileError(f"{path}: graph input {i.name!r} is none of input_ids, "
                       "attention_mask, token_type_ids.")
    feed[i.name] = {"input_ids": ids, "attention_mask": mask}.get(i.name, np.zeros_like(ids))
  ref = sess.run([hidden_state_output(str(path))], feed)[0]
  ours = np.asarray(model.apply(ids, mask).hidden_states[-1])
  return float(np.abs(ours - ref)[mask.astype(bool)].max())
