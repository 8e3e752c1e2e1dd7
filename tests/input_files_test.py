"""Results bound to the content of the files they read (data files, model files)."""

import json
import os
import re
import shutil
import types

import pytest

from configs import quickstart
from papa_jax import registry, run, stage
from papa_jax.workdir import input_files, rules as workdir
from papa_jax.papa import means as means_lib
from tests import testing
from tests.testing import require_shared, tiny_config


def _edit_label(path) -> None:
  """Flips the label of the first example labelled 0 (same size, other content)."""
  text = open(path).read()
  i = text.index("\t0\n")
  with open(path, "w") as f:
    f.write(text[:i] + "\t1\n" + text[i + 3:])


def _touch(path) -> None:
  st = os.stat(path)
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**10))


@pytest.mark.unit
def test_file_record_touch_is_not_a_change_the_hash_decides(tmp_path):
  p = tmp_path / "train.tsv"
  p.write_text("sentence\tlabel\ngood\t1\n")
  old = input_files.source_record([str(p)])
  _touch(p)
  new = input_files.source_record([str(p)], old)
  assert new["files"][str(p)]["mtime_ns"] != old["files"][str(p)]["mtime_ns"]
  assert input_files.changes(dict(train=old), dict(train=new), ["train"]) == []


@pytest.mark.unit
def test_file_record_cache_is_trusted_only_while_size_mtime_ctime_inode_hold(tmp_path,
                                                                            monkeypatch):
  calls = []
  real = input_files.sha256
  monkeypatch.setattr(input_files, "sha256", lambda path: calls.append(path) or real(path))
  p = tmp_path / "train.tsv"
  p.write_text("sentence\tlabel\ngood\t1\n")
  fresh = input_files.file_record(str(p))
  assert not fresh["trusted"]  # Changed within RACY_NS of its hashing: hashed again next time.
  assert input_files.file_record(str(p), fresh)["sha256"] == fresh["sha256"] and len(calls) == 2
  monkeypatch.setattr(input_files, "RACY_NS", 0)
  old = input_files.file_record(str(p))
  assert old["trusted"] and input_files.file_record(str(p), old) == old and len(calls) == 3
  st = os.stat(p)
  p.write_text("sentence\tlabel\ngood\t0\n")  # Same size; the old mtime put back.
  os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
  new = input_files.file_record(str(p), old)
  assert len(calls) == 4 and new["sha256"] != old["sha256"]  # ctime moved: not trusted.
  p.write_text("sentence\tlabel\ngood\t10\n")
  assert input_files.file_record(str(p), new)["size"] == new["size"] + 1 and len(calls) == 5


@pytest.mark.unit
def test_changes_name_the_file_and_what_changed(tmp_path):
  p = tmp_path / "dev.tsv"
  p.write_text("sentence\tlabel\ngood\t1\n")
  a = input_files.source_record([str(p)])
  p.write_text("sentence\tlabel\ngood\t0\n")
  b = input_files.source_record([str(p)])
  p.write_text("sentence\tlabel\ngood\t10\n")
  c = input_files.source_record([str(p)])
  [same_size] = input_files.changes(dict(validation=a), dict(validation=b), ["validation"])
  assert same_size.startswith(f"validation: {p} changed content (same size, 22 bytes; sha256 ")
  [size] = input_files.changes(dict(validation=b), dict(validation=c), ["validation"])
  assert size == f"validation: {p} changed size (22 bytes -> 23 bytes)"
  assert input_files.changes(dict(validation=a), dict(validation=b), ["train"]) == []
  moved = tmp_path / "moved"
  moved.mkdir()
  shutil.copy(p, moved / "dev.tsv")  # The same bytes elsewhere: the same input.
  assert input_files.changes(dict(validation=c),
                             dict(validation=input_files.source_record([str(moved / "dev.tsv")])),
                             ["validation"]) == []


def _bind(c, wd, inputs):
  workdir.bind(c, str(wd), finished=registry.finished_outputs(),
               output_dirs=registry.output_dirs(), inputs=inputs,
               finished_sources={p: ("train", "model") for p in registry.finished_outputs()})


@pytest.mark.unit
def test_bind_refuses_changed_bound_sources_only_and_old_workdirs(tmp_path):
  c = quickstart.get_config()
  f = tmp_path / "f.tsv"
  f.write_text("a\n")
  rec = lambda: input_files.source_record([str(f)])
  model = dict(files={}, fingerprint="m1")
  wd = tmp_path / "wd"
  _bind(c, wd, dict(train=rec(), validation=rec(), model=model))
  (wd / "means").mkdir()
  (wd / "means" / "means_raw.npz").write_bytes(b"")  # Finished work that read train and model.
  f.write_text("b\n")
  _bind(c, wd, dict(validation=rec(), model=model))  # Nothing finished read validation.
  with pytest.raises(input_files.InputChangedError, match=rf"train: {f} changed content"):
    _bind(c, wd, dict(train=rec(), model=model))
  with pytest.raises(input_files.InputChangedError, match=r"model: fingerprint m1 -> m2"):
    _bind(c, wd, dict(model=dict(files={}, fingerprint="m2")))
  os.remove(wd / "inputs.json")
  with pytest.raises(input_files.InputChangedError, match="written before papa-jax recorded"):
    _bind(c, wd, dict(train=rec(), model=model))
  c.overwrite = True
  _bind(c, wd, dict(train=rec(), model=model))  # Removes the results, records the new files.
  assert not (wd / "means").exists()
  assert json.load(open(wd / "inputs.json"))["sources"]["train"] == rec()


def _setup(config, sources):
  """A `Setup` without a model: only what the fingerprints read."""
  s = stage.Setup.__new__(stage.Setup)
  s.config, s.model = config, types.SimpleNamespace(fingerprint="m")
  s.task = types.SimpleNamespace(eval_split="validation")
  s.__dict__["input_sources"] = sources
  return s


@pytest.mark.unit
@pytest.mark.parametrize("declared", [False, True])
def test_every_unit_fingerprint_covers_the_content_of_what_it_reads(tmp_path, declared):
  c = tiny_config(tmp_path)
  if declared:  # Labels collected from train: every split's ids depend on the train file.
    c.data.task = "custom"
    c.data.custom.update(format="tsv", text_fields=("sentence",), label_field="label",
                         train="train.tsv", validation="dev.tsv")
  f = tmp_path / "x"
  f.write_text("a")
  one = input_files.source_record([str(f)])
  f.write_text("b")
  other = input_files.source_record([str(f)])
  base = dict(train=one, validation=one, model=dict(files={}, fingerprint="m"))
  a, b = _setup(c, base), _setup(c, dict(base, train=other))
  assert a.result_fingerprint(stage="sort") != b.result_fingerprint(stage="sort")
  assert a.data_fingerprint(("train",)) != b.data_fingerprint(("train",))  # The means file's.
  analysis = lambda s: s.fingerprint(("effective",), ("analysis",), stage="effective")
  assert (analysis(a) != analysis(b)) == declared
  moved = dict(one, files={"/elsewhere/train.tsv": one["files"][str(f)]})
  assert _setup(c, dict(base, train=moved)).result_fingerprint(stage="sort") == \
      a.result_fingerprint(stage="sort")


@pytest.mark.slow
@pytest.mark.parametrize("declared", [False, True])
def test_edited_label_refused_naming_the_file_touch_is_not(tmp_path, minilm, declared):
  """The acceptance test: one label edited between two runs of the same command."""
  del minilm
  data = tmp_path / "data"
  data.mkdir()
  for name in ("train.tsv", "dev.tsv"):
    shutil.copy(require_shared("data", "sst2", name), data / name)
    os.chmod(data / name, 0o644)
  c = tiny_config(tmp_path, stage="means", **{"data.data_dir": str(data)})
  if declared:
    c.data.task = "custom"
    c.data.custom.update(format="tsv", text_fields=("sentence",), label_field="label",
                         train="train.tsv", validation="dev.tsv")
  wd = str(tmp_path / "wd")
  run.run(c, wd)
  means = os.path.join(wd, "means", "means_raw.npz")
  written = os.stat(means).st_mtime_ns
  _touch(data / "train.tsv")  # New mtime, same bytes: reused, not refused.
  run.run(c, wd)
  assert os.stat(means).st_mtime_ns == written
  _edit_label(data / "train.tsv")
  with pytest.raises(input_files.InputChangedError,
                     match=re.escape(f"train: {data / 'train.tsv'} changed content (same size")):
    run.run(c, wd)
  assert os.stat(means).st_mtime_ns == written
  c.overwrite = True
  run.run(c, wd)  # Recomputed from the edited file.
  meta = means_lib.load_means(means).metadata
  assert meta["data_files"]["train"] == {
      str(data / "train.tsv"): input_files.sha256(str(data / "train.tsv"))}


@pytest.mark.unit
def test_finetune_partial_sums_are_keyed_by_the_other_models_file_content(tmp_path):
  from papa_jax.analysis import finetune  # pylint: disable=import-outside-toplevel
  other = tmp_path / "other"
  shutil.copytree(require_shared("fixtures", "tiny-random", "bert", "BertModel"), other)
  os.chmod(other / "model.safetensors", 0o644)
  key = lambda: finetune.Finetune(str(other)).key(None)
  before = key()
  _touch(other / "model.safetensors")
  assert key() == before  # The same bytes.
  with open(other / "model.safetensors", "r+b") as f:
    f.seek(-1, os.SEEK_END)
    last = f.read(1)
    f.seek(-1, os.SEEK_END)
    f.write(bytes([last[0] ^ 1]))  # One bit of the last weight.
  assert key() != before


@pytest.mark.integration
def test_model_files_are_what_the_model_is_read_from(tmp_path):
  """config.json and weights for a Hugging Face folder; the .onnx file for an ONNX export
  (no config.json, no safetensors: a run on one used to fail binding its inputs)."""
  hf = require_shared("fixtures", "tiny-random", "bert", "BertModel")  # No tokenizer files.
  assert stage.model_files(str(hf)) == [str(hf / "config.json"), str(hf / "model.safetensors")]
  onnx_dir = testing.require_model("minilm_l3")
  tokenizer = [os.path.join(onnx_dir, n) for n in (
      "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")]
  c = tiny_config(tmp_path, **{"model.name": onnx_dir})
  bound = stage.Setup(c, str(tmp_path / "wd")).input_sources["model"]["files"]
  assert sorted(bound) == sorted([os.path.join(onnx_dir, "paraphrase-MiniLM-L3-v2.onnx"),
                                  *tokenizer])
  assert sorted(stage.model_files(str(hf), tokenizer_dir=onnx_dir)[2:]) == sorted(tokenizer)
