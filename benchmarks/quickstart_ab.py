"""The quickstart end to end at two commits, back to back in one command.

  python benchmarks/quickstart_ab.py [--old def1d40] [--new HEAD] [--out /tmp/qs_ab]

Checks each commit out into a temporary git worktree, runs
`launch/main.py --config=configs/quickstart.py` there (its own code first on
PYTHONPATH, the same virtual env, a fresh workdir), and prints the wall time of
each, their ratio, each stage's time from the logs, and whether every score of
`results.json` is identical. Runs are sequential, so each has the whole CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGE = re.compile(r"Stage (\w+) finished in ([0-9.]+)s")


def _git(*args: str) -> str:
  return subprocess.run(["git", "-C", ROOT, *args], check=True, capture_output=True,
                        text=True).stdout.strip()


def run_commit(rev: str, out: str) -> dict:
  """Runs the quickstart at `rev`; returns wall seconds, stage seconds and scores."""
  sha = _git("rev-parse", rev)
  tree, workdir = os.path.join(out, f"tree_{sha[:8]}"), os.path.join(out, f"wd_{sha[:8]}")
  if not os.path.isdir(tree):
    _git("worktree", "add", "--detach", tree, sha)
  if os.path.exists(workdir):
    raise SystemExit(f"{workdir} exists; pass a fresh --out so nothing is reused.")
  env = dict(os.environ, PYTHONPATH=tree)
  cmd = [sys.executable, "launch/main.py", "--config=configs/quickstart.py",
         f"--workdir={workdir}"]
  print(f"[{rev} = {sha[:8]}] {' '.join(cmd)}", flush=True)
  t = time.perf_counter()
  proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
  wall = time.perf_counter() - t
  with open(os.path.join(out, f"log_{sha[:8]}.txt"), "w") as f:
    f.write(proc.stdout + proc.stderr)
  if proc.returncode:
    raise SystemExit(f"{rev} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
  rows = json.load(open(os.path.join(workdir, "results.json")))["rows"]
  scores = {(r["variant"], r["static_heads"], r.get("seed", "")): r["score"] for r in rows}
  stages = {m[1]: float(m[2]) for m in STAGE.finditer(proc.stderr)}
  print(f"[{rev}] {wall:.0f} s; stages {stages}", flush=True)
  return dict(rev=rev, sha=sha[:8], wall=wall, stages=stages, scores=scores)


def _scores_by_run(scores: dict) -> dict:
  """(variant, heads) -> score; the seed column is dropped when there is one seed."""
  return {k[:2]: v for k, v in scores.items()}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--old", default="def1d40")
  ap.add_argument("--new", default="HEAD")
  ap.add_argument("--out", default="/tmp/quickstart_ab")
  args = ap.parse_args()
  os.makedirs(args.out, exist_ok=True)
  m = common.machine()
  print(f"Machine: {m['cpu']} ({m['cpu_kind']}: {m['cpu_flags']}), {m['cores']} cores; "
        f"JAX {m['jax']}; XLA_FLAGS='{m['xla_flags']}'", flush=True)
  old, new = run_commit(args.old, args.out), run_commit(args.new, args.out)
  a, b = _scores_by_run(old["scores"]), _scores_by_run(new["scores"])
  same = a.keys() == b.keys() and all(a[k] == b[k] for k in a)
  print("\n| commit | wall | " + " | ".join(sorted(set(old["stages"]) | set(new["stages"])))
        + " |")
  print("|---|---|" + "---|" * len(set(old["stages"]) | set(new["stages"])))
  for r in (old, new):
    print(f"| {r['rev']} ({r['sha']}) | {r['wall']:.0f} s | " + " | ".join(
        f"{r['stages'].get(s, 0):.0f} s" for s in sorted(set(old["stages"]) | set(new["stages"])))
        + " |")
  print(f"\nnew / old wall time: {new['wall'] / old['wall']:.3f}")
  print(f"scores identical: {same}")
  for k in sorted(a):
    print(f"  {k}: old {a[k]:.4f} new {b.get(k, float('nan')):.4f}")
  if not same:
    raise SystemExit(1)


if __name__ == "__main__":
  main()
