"""The README's recorded-suite section, regenerated from a suite workdir's report."""

import json
import os

import pytest

from papa_jax import report_readme
from papa_jax.report import build as report
from tests.report_claims_test import N_BOOT, _claims_suite

pytestmark = pytest.mark.unit


@pytest.fixture
def suite_dir(tmp_path):
  """A suite workdir: two finished cells (results.json, a probe result) and its report."""
  good, _ = _claims_suite()
  cells = good[:2]
  for i, e in enumerate(cells):
    cell = tmp_path / "suite" / f"{e.model}__{e.task.name}"
    (cell / "probe" / "raw_k0_s0").mkdir(parents=True)
    (cell / "probe" / "raw_k0_s0" / "result.json").write_text("{}")
    (cell / "results.json").write_text(json.dumps(dict(
        git_revision=f"{i}abcdef0123", devices=1,
        rows=[dict(git_revision=None if i == 0 else "2fedcba98-dirty"),
              dict(git_revision="3fedcba98")],
        cpu=dict(model="Test CPU", kind="avx2"),
        config=dict(probe=dict(learning_rate=2e-5, epochs=15),
                    data=dict(task=e.task.name, max_length=64, papa_layout=True),
                    sort=dict(max_train_examples=-1)))))
  report.write_report(cells, str(tmp_path / "suite" / "report"), n_boot=N_BOOT)
  return tmp_path / "suite"


def test_readme_section_is_regenerated_between_its_markers_only(suite_dir, tmp_path):
  readme = tmp_path / "README.md"
  before, after = "# Title\n\ntext before\n\n", "\n\n## Next\n\ntext after\n"
  readme.write_text(before + report_readme.BEGIN + "\nhand-written, stale\n"
                    + report_readme.END + after)
  figure = tmp_path / "docs" / "figures" / "suite_curves.png"
  block = report_readme.write(str(suite_dir), str(readme), str(figure))
  text = readme.read_text()
  assert text == before + report_readme.BEGIN + "\n" + block + report_readme.END + after
  assert "hand-written" not in text
  assert figure.read_bytes() == (suite_dir / "report" / "curves.png").read_bytes()
  assert "](docs/figures/suite_curves.png)" in block
  # Provenance from the cells: both revisions, the CPU, the cell count; the claims table
  # and the recipe from the cells' configs.
  assert "2 cells: m0, m1 × sst2" in block
  # Each probe's own revision; results.json's (its last writer) only for rows without one.
  assert ("probes trained by the code at 2fedcba-dirty, 3fedcba; the revision is not "
          "recorded for 1 of 4 probes (trained before probe results carried it; their cells' "
          "results.json last written at 0abcdef, which may only have passed over them);") \
      in block
  assert "1abcdef" not in block
  assert "Test CPU (avx2, 1 device(s))" in block and f"B = {N_BOOT} bootstrap" in block
  assert "| All heads constant: about 8% average relative drop. |" in block
  assert "learning rate 2e-05, 15 epochs, the sorting run on all examples" in block
  assert "m0 (4 heads), m1 (4 heads)" in block
  assert "Inputs cut to 64 tokens (sst2). In the PAPA layout a single sentence keeps at " \
      "most L/2 − 1 word pieces" in block
  report_readme.write(str(suite_dir), str(readme), str(figure))
  assert readme.read_text() == text  # Regenerating is idempotent.
  report_readme.main([str(suite_dir), "--readme", str(readme), "--figure", str(figure),
                      "--command", "python launch/main.py --config=configs/suite.py:x"])
  assert "```bash\npython launch/main.py --config=configs/suite.py:x\n```" in \
      readme.read_text()


@pytest.mark.parametrize("text", ["no markers\n", f"{report_readme.END}\n{report_readme.BEGIN}\n",
                                  f"{report_readme.BEGIN}\n{report_readme.BEGIN}\n"
                                  f"{report_readme.END}\n"])
def test_readme_without_one_pair_of_markers_is_refused(text):
  with pytest.raises(ValueError, match="must hold one <!-- suite-report:begin --> line"):
    report_readme.splice(text, "block", "README.md")


def test_the_repository_readme_has_the_section_markers():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
    report_readme.splice(f.read(), "x")
