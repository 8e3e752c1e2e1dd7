"""One version everywhere (`papa_jax.__version__`), and the citation files agree."""

import os
import re
import subprocess
import sys

import pytest

import papa_jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(name: str) -> str:
  with open(os.path.join(ROOT, name), encoding="utf-8") as f:
    return f.read()


@pytest.mark.integration
def test_version_is_one_everywhere():
  v = papa_jax.__version__
  assert re.fullmatch(r"\d+\.\d+\.\d+", v)
  setup = subprocess.run([sys.executable, "setup.py", "--version"], cwd=ROOT, text=True,
                         capture_output=True, timeout=60, check=True)
  assert setup.stdout.strip().splitlines()[-1] == v
  assert re.search(r"^version: (\S+)$", _read("CITATION.cff"), re.M).group(1) == v
  released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", _read("CHANGELOG.md"),
                        re.M)
  assert released and released[0] == v, "CHANGELOG.md's newest version is not __version__"
  assert f"version = {{{v}}}" in _read("docs/citing.md")


@pytest.mark.unit
def test_citations_agree():
  """Every paper of CITATION.cff has its BibTeX entry in docs/citing.md, and the license
  is the one setup.py declares."""
  cff, bib = _read("CITATION.cff"), _read("docs/citing.md")
  titles = re.findall(r"^  - type: conference-paper\n    title: \"?(.+?)\"?$", cff, re.M)
  flat_bib = re.sub(r"\s+", " ", bib.replace("{", "").replace("}", ""))
  assert len(titles) == 10
  missing = [t for t in titles if t not in flat_bib]
  assert not missing, f"docs/citing.md lacks {missing}"
  assert _read("LICENSE").split()[:3] == ["Apache", "License", "Version"]
  assert 'license="Apache-2.0"' in _read("setup.py") and "license: Apache-2.0" in cff
