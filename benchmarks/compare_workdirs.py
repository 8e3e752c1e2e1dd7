"""Do two finished workdirs of the same experiment give the same scores?

  python benchmarks/compare_workdirs.py REFERENCE OTHER [--n-boot 2000] [--out table.md]

For runs that differ in how they compute, not in what (float32 vs bfloat16,
two XLA settings, two machines). Per variant and static-head count: each
side's score (mean and std over its seeds), the difference OTHER - REFERENCE
with a paired bootstrap interval over dev examples and seeds
(`uncertainty.paired_bootstrap`), whether 0 is inside it, how many dev
predictions changed (same seed), and whether the sorted head sets agree.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from papa_jax import suite, uncertainty  # noqa: E402


def compare(ref, other, *, n_boot: int = 2000, seed: int = 0) -> list[dict]:
  """One row per (variant, static heads) that both `report.Experiment`s hold."""
  if ref.task.name != other.task.name or not np.array_equal(ref.labels, other.labels):
    raise ValueError("The two runs are not the same task with the same dev labels.")
  rows = []
  for key in sorted(set(ref.predictions) & set(other.predictions)):
    a, b = ref.predictions[key], other.predictions[key]
    res = uncertainty.paired_bootstrap(ref.task, ref.labels, a, b, n_boot=n_boot, seed=seed)
    common = sorted(set(a) & set(b))
    changed = [int(np.sum(a[s] != b[s])) for s in common]
    # OTHER - REFERENCE (+ 0.0 turns -0.0 into 0.0).
    diff_ci = [-res["abs_diff_ci"][1] + 0.0, -res["abs_diff_ci"][0] + 0.0]
    rows.append(dict(
        variant=key[0], static_heads=key[1], metric=res["metric"], n_examples=res["n_examples"],
        seeds=common, reference=res["baseline"], reference_std=float(np.std(res["baseline_seeds"])),
        other=res["treatment"], other_std=float(np.std(res["treatment_seeds"])),
        difference=-res["abs_diff"] + 0.0, difference_ci=diff_ci,
        within_noise=bool(diff_ci[0] <= 0.0 <= diff_ci[1]),
        changed_predictions=changed, same_heads=_same_heads(ref, other, key[1])))
  return rows


def _same_heads(ref, other, k: int) -> bool | None:
  if ref.ranking is None or other.ranking is None:
    return None
  return {tuple(h) for h in ref.ranking[:k]} == {tuple(h) for h in other.ranking[:k]}


def markdown(rows: list[dict], ref_dir: str, other_dir: str) -> str:
  n = rows[0]["n_examples"] if rows else 0
  lines = [f"reference `{ref_dir}`, other `{other_dir}`; {n} dev examples, "
           "mean ± std over seeds, 95% paired bootstrap interval of the difference",
           "",
           "| variant | static heads | seeds | reference | other | other - reference | 95% CI "
           "| within noise | changed predictions | same heads |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(
        f"| {r['variant']} | {r['static_heads']} | {len(r['seeds'])} "
        f"| {r['reference']:.4f} ± {r['reference_std']:.4f} | {r['other']:.4f} ± "
        f"{r['other_std']:.4f} | {r['difference']:+.4f} | [{r['difference_ci'][0]:+.4f}, "
        f"{r['difference_ci'][1]:+.4f}] | {'yes' if r['within_noise'] else '**no**'} "
        f"| {', '.join(map(str, r['changed_predictions']))} | {r['same_heads']} |")
  return "\n".join(lines) + "\n"


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("reference")
  p.add_argument("other")
  p.add_argument("--n-boot", type=int, default=2000)
  p.add_argument("--out", default="", help="Also write the table here (and a .json beside it).")
  a = p.parse_args()
  rows = compare(suite.load_experiment(a.reference), suite.load_experiment(a.other),
                 n_boot=a.n_boot)
  table = markdown(rows, a.reference, a.other)
  print(table)
  if a.out:
    with open(a.out, "w") as f:
      f.write(table)
    with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
