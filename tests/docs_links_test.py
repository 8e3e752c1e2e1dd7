"""The documents' references hold: relative links (and their #anchors) and config files."""

import glob
import os
import re

import pytest

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "benchmarks/RESULTS.md",
        *sorted(os.path.relpath(p, ROOT) for p in glob.glob(f"{ROOT}/docs/*.md"))]
_CODE = re.compile(r"^```.*?^```", re.S | re.M)


def _read(path: str) -> str:
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    return f.read()


def anchors(text: str) -> set[str]:
  """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens,
  repeats numbered."""
  out, seen = set(), {}
  for title in re.findall(r"^#{1,6} +(.+?) *$", _CODE.sub("", text), re.M):
    slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    out.add(slug if n == 0 else f"{slug}-{n}")
  return out


def test_anchors_follow_github():
  assert anchors("## `data.custom`\n## Tasks: built-in, or yours\n```\n# no\n```\n## Tasks: "
                 "built-in, or yours") == {"datacustom", "tasks-built-in-or-yours",
                                           "tasks-built-in-or-yours-1"}


@pytest.mark.parametrize("path", DOCS)
def test_docs_links_resolve(path):
  text = _read(path)
  bad = []
  for target in re.findall(r"\]\(([^)\s]+)\)", _CODE.sub("", text)):
    if re.match(r"[a-z]+:", target):
      continue  # A web address.
    file, _, anchor = target.partition("#")
    full = os.path.normpath(os.path.join(ROOT, os.path.dirname(path), file)) if file else ""
    if file and not os.path.exists(full):
      bad.append(f"{target}: no such file")
    elif anchor and anchor not in anchors(_read(full) if file else text):
      bad.append(f"{target}: no such section")
  assert not bad, f"{path}: " + "; ".join(bad)


@pytest.mark.parametrize("path", DOCS)
def test_docs_config_files_exist(path):
  """A `configs/x.py` named is in the repository, or written out in the same document
  (a code block starting `# configs/x.py`)."""
  text = _read(path)
  bad = sorted({c for c in re.findall(r"\bconfigs/\w+\.py", text)
                if not os.path.exists(os.path.join(ROOT, c)) and f"# {c}\n" not in text})
  assert not bad, f"{path} names config files that do not exist: {bad}"
