"""Reading ONNX graphs: the file, producer/consumer indices, constant values.

`onnx` is optional: `import_onnx` names the install command when it is missing.
"""

from __future__ import annotations

import collections
import os
from typing import Any

import numpy as np

from papa_jax.errors import ModelFileError, ModelNotFound

INSTALL = "pip install onnx onnxruntime  (or: pip install 'papa-jax[onnx]')"


def import_onnx():
  """The `onnx` package, or an ImportError naming the install command."""
  try:
    import onnx  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError(f"Reading ONNX models needs the `onnx` package: {INSTALL}.") from e
  return onnx


def load_model(path: str):
  """The parsed ONNX ModelProto of `path` (weights included), or a clear error."""
  onnx = import_onnx()
  if not os.path.isfile(path):
    raise ModelNotFound(f"ONNX file {path!r} does not exist.")
  try:
    return onnx.load(path)
  except Exception as e:  # protobuf DecodeError, missing external data, ...: one message.
    raise ModelFileError(f"Could not read ONNX file {path} (corrupt or truncated?): "
                     f"{type(e).__name__}: {str(e)[:300]}") from e


class Graph:
  """Producer/consumer indices and constants of an ONNX graph."""

  def __init__(self, model, source: str):
    from onnx import numpy_helper  # pylint: disable=import-outside-toplevel
    self.source = source
    graph = model.graph
    self.opset_import = list(model.opset_import)
    self.nodes = list(graph.node)
    self.inits = {t.name: t for t in graph.initializer}
    self.outputs = [o.name for o in graph.output]
    self.producer = {o: n for n in self.nodes for o in n.output}
    self.uses: dict[str, list] = collections.defaultdict(list)
    for n in self.nodes:
      for i, name in enumerate(n.input):
        self.uses[name].append((n, i))
    self._np = numpy_helper
    self._arrays: dict[str, np.ndarray] = {}
    self.weight_tensors: dict[str, str] = {}  # HF name -> tensor, once weights are named.

  def array(self, name: str) -> np.ndarray:
    if name not in self._arrays:
      self._arrays[name] = self._np.to_array(self.inits[name])
    return self._arrays[name]

  def const(self, name: str) -> np.ndarray | None:
    """The value of a constant tensor (initializer, Constant node, Identity of either)."""
    if name in self.inits:
      return self.array(name)
    n = self.producer.get(name)
    if n is not None and n.op_type == "Constant":
      for a in n.attribute:
        if a.name == "value":
          return self._np.to_array(a.t)
        if a.name in ("value_float", "value_int"):
          return np.asarray(a.f if a.name == "value_float" else a.i)
        if a.name in ("value_floats", "value_ints"):
          return np.asarray(list(a.floats) if a.name == "value_floats" else list(a.ints))
    if n is not None and n.op_type == "Identity":
      return self.const(n.input[0])
    return None

  def scalar(self, name: str) -> float | None:
    v = self.const(name)
    return float(v.reshape(-1)[0]) if v is not None and v.size == 1 else None

  def direct_uses(self, name: str) -> list:
    """(node, input index) of every use, looking through Identity nodes."""
    out = []
    for n, i in self.uses.get(name, []):
      out += self.direct_uses(n.output[0]) if n.op_type == "Identity" else [(n, i)]
    return out

  def refuse(self, what: str) -> ModelFileError:
    return ModelFileError(f"{self.source}: {what}")


def attr(node, name: str, default: Any = None) -> Any:
  from onnx import helper  # pylint: disable=import-outside-toplevel
  for a in node.attribute:
    if a.name == name:
      v = helper.get_attribute_value(a)
      return v.decode() if isinstance(v, bytes) else v
  return default


def own_uses(g: Graph, name: str) -> list:
  return [(n, i) for n, i in g.uses.get(name, []) if n.op_type != "Identity"]


def identity_outputs(g: Graph, name: str) -> list[str]:
  """Identity outputs (recursively) that are used by non-Identity nodes."""
  out = []
  for n, _ in g.uses.get(name, []):
    if n.op_type == "Identity":
      o = n.output[0]
      if own_uses(g, o):
        out.append(o)
      out += identity_outputs(g, o)
  return out


def shape_tail(g: Graph, name: str) -> list | None:
  """A Reshape target as a list (None for runtime entries), or None if unknown."""
  v = g.const(name)
  if v is not None:
    return [int(x) for x in v.reshape(-1)]
  n = g.producer.get(name)
  if n is None or n.op_type != "Concat":
    return None
  out: list = []
  for part in n.input:
    v = g.const(part)
    p = g.producer.get(part)
    if v is not None:
      out += [int(x) for x in v.reshape(-1)]
    elif p is not None and p.op_type == "Unsqueeze":
      out.append(None)
    else:
      return None
  return out
