"""The family registry (`papa_jax/convert/families`) is the one list of families: each claims
its own model_types, has its module and its oracle entry (`tests/hf_oracle.py`), and says
truly which HF class, base prefix and code path it has. The tests' family lists derive from it,
so a family added with its module, registry entry and oracle entry is covered everywhere."""

import importlib
import os
import pkgutil
from collections import Counter

import pytest

from papa_jax.convert import families, hf_config
from papa_jax.convert.families import FAMILIES, CodePath, Family
from tests import hf_oracle

pytestmark = pytest.mark.unit

HELPERS = ("family", "rules")  # Modules of the package that are not a family.


def test_families_claim_each_model_type_once():
  claims = Counter(t for f in FAMILIES for t in f.model_types)
  twice = sorted(t for t, n in claims.items() if n > 1)
  assert not twice, f"model_types claimed by more than one family: {twice}"
  names = Counter(f.name for f in FAMILIES)
  assert all(n == 1 for n in names.values()), names
  assert set(hf_config.MODEL_TYPES) == set(claims) == set(families.BY_MODEL_TYPE)
  assert hf_config.MODEL_TYPES == {t: f.name for f in FAMILIES for t in f.model_types}
  assert families.BY_NAME == {f.name: f for f in FAMILIES}


def test_families_one_module_each_and_every_module_registered():
  """Each family module exports registered records only, and each record lives in one."""
  path = os.path.dirname(families.__file__)
  modules = sorted(m.name for m in pkgutil.iter_modules([path]) if m.name not in HELPERS)
  exported = {}
  for name in modules:
    module = importlib.import_module(f"{families.__name__}.{name}")
    records = [v for v in vars(module).values() if isinstance(v, Family)]
    assert records, f"families/{name}.py exports no Family record"
    exported.update({id(f): name for f in records})
  unregistered = sorted(m for i, m in exported.items() if i not in {id(f) for f in FAMILIES})
  assert not unregistered, f"Family records missing from families.FAMILIES: {unregistered}"
  assert all(id(f) in exported for f in FAMILIES)
  for f in FAMILIES:
    assert f.model_types and all(isinstance(t, str) for t in f.model_types), f.name
    assert isinstance(f.code_path, CodePath), f.name
    assert f.oracle_class.isidentifier() and not f.base_prefix.endswith("."), f.name
    assert callable(f.config) and callable(f.rules), f.name


def test_families_each_has_its_oracle_entry():
  """tests/hf_oracle.py has random configs for every registered family (one architecture named
  after it), and none for a family the registry lacks."""
  names = [f.name for f in FAMILIES]
  missing = [n for n in names if n not in hf_oracle.RANDOM_CONFIGS]
  assert not missing, ("registered families without random HF configs in "
                       f"tests/hf_oracle.py RANDOM_CONFIGS: {missing}")
  unnamed = [n for n in names if n not in hf_oracle.RANDOM_CONFIGS[n]]
  assert not unnamed, f"families without an oracle architecture named after them: {unnamed}"
  stale = sorted(set(hf_oracle.RANDOM_CONFIGS) - set(names))
  assert not stale, f"oracle entries of unregistered families: {stale}"
  archs = [a for n in names for a in hf_oracle.RANDOM_CONFIGS[n]]
  assert len(archs) == len(set(archs)) and hf_oracle.ARCHS == tuple(archs)
  assert set(hf_oracle.ONE_PER_PATH) | set(hf_oracle.LAYOUTS) | set(hf_oracle.POST_LN) <= set(
      names)


def test_families_say_truly_what_the_oracle_builds():
  """Each oracle architecture of a family converts to that family with the family's code
  path, and its Hugging Face class is the family's `oracle_class`, whose base-model prefix is
  the family's `base_prefix`."""
  pytest.importorskip("torch")
  tr = pytest.importorskip("transformers")
  for f in FAMILIES:
    cls = getattr(tr, f.oracle_class)
    assert cls.base_model_prefix == f.base_prefix, f.name
    for arch in hf_oracle.RANDOM_CONFIGS[f.name]:
      config, oracle = hf_oracle.spec(arch)
      c = hf_config.encoder_config_from_hf(config.to_dict())
      assert oracle is cls and config.model_type in f.model_types, arch
      assert c.family == f.name and CodePath.of(c) == f.code_path, (arch, CodePath.of(c))
