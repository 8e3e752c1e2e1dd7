"""The quickstart end to end at two commits, back to back in one command.

  python benchmarks/quickstart_ab.py [--old def1d40] [--new HEAD] [--out /tmp/qs_ab]
      [--seeds 42,43,44]

Checks each commit out into a temporary git worktree, runs
`launch/main.py --config=configs/quickstart.py` there (its own code first on
PYTHONPATH, the same virtual env, a fresh workdir), and prints the wall time of
each, their ratio, each stage's time from the logs, each run's peak resident
memory and CPU time (the child's rusage), and whether every score of
`results.json` is identical (with several seeds, probes trained together may
differ by float reassociation: the largest difference is printed, and more than
0.005 fails). Runs are sequential, so each has the whole CPU.
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


def run_commit(rev: str, out: str, seeds: str = "") -> dict:
  """Runs the quickstart at `rev`; returns wall seconds, stage seconds and scores."""
  sha = _git("rev-parse", rev)
  tree, workdir = os.path.join(out, f"tree_{sha[:8]}"), os.path.join(out, f"wd_{sha[:8]}")
  if not os.path.isdir(tree):
    _git("worktree", "add", "--detach", tree, sha)
  if os.path.exists(workdir):
    raise SystemExit(f"{workdir} exists; pass a fresh --out so nothing is reused.")
  env = dict(os.environ, PYTHONPATH=tree)
  cmd = [sys.executable, "launch/main.py", "--config=configs/quickstart.py",
         f"--workdir={workdir}"] + ([f"--config.papa.seeds=({seeds},)"] if seeds else [])
  print(f"[{rev} = {sha[:8]}] {' '.join(cmd)}", flush=True)
  log = os.path.join(out, f"log_{sha[:8]}.txt")
  t = time.perf_counter()
  with open(log, "w") as f:
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=f, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
  wall = time.perf_counter() - t
  text = open(log).read()
  if os.waitstatus_to_exitcode(status):
    raise SystemExit(f"{rev} failed ({status}):\n{text[-3000:]}")
  rows = json.load(open(os.path.join(workdir, "results.json")))["rows"]
  scores = {(r["variant"], r["static_heads"], r.get("seed", "")): r["score"] for r in rows}
  stages = {m[1]: float(m[2]) for m in STAGE.finditer(text)}
  peak, cpu = usage.ru_maxrss / 2**20, usage.ru_utime + usage.ru_stime
  print(f"[{rev}] {wall:.0f} s, CPU {cpu:.0f} s, peak RSS {peak:.2f} GiB; stages {stages}",
        flush=True)
  return dict(rev=rev, sha=sha[:8], wall=wall, stages=stages, scores=scores, peak=peak,
              cpu=cpu)


def _scores_by_run(scores: dict) -> dict:
  """(variant, heads) -> score; the seed column is dropped when there is one seed."""
  seeds = {k[2] for k in scores}
  return {k[:2]: v for k, v in scores.items()} if len(seeds) == 1 else scores


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--old", default="def1d40")
  ap.add_argument("--new", default="HEAD")
  ap.add_argument("--out", default="/tmp/quickstart_ab")
  ap.add_argument("--seeds", default="", help="e.g. 42,43,44 (default: the config's one seed)")
  args = ap.parse_args()
  os.makedirs(args.out, exist_ok=True)
  m = common.machine()
  print(f"{common.machine_line(m)}; XLA_FLAGS='{m['xla_flags']}'", flush=True)
  print(f"Load before: {os.getloadavg()}", flush=True)
  old = run_commit(args.old, args.out, args.seeds)
  new = run_commit(args.new, args.out, args.seeds)
  print(f"Load after: {os.getloadavg()}", flush=True)
  a, b = _scores_by_run(old["scores"]), _scores_by_run(new["scores"])
  same = a.keys() == b.keys() and all(a[k] == b[k] for k in a)
  print("\n| commit | wall | CPU | peak RSS | " + " | ".join(
      sorted(set(old["stages"]) | set(new["stages"]))) + " |")
  print("|---|---|---|---|" + "---|" * len(set(old["stages"]) | set(new["stages"])))
  for r in (old, new):
    print(f"| {r['rev']} ({r['sha']}) | {r['wall']:.0f} s | {r['cpu']:.0f} s | "
          f"{r['peak']:.2f} GiB | " + " | ".join(
        f"{r['stages'].get(s, 0):.0f} s" for s in sorted(set(old["stages"]) | set(new["stages"])))
        + " |")
  print(f"\nnew / old wall time: {new['wall'] / old['wall']:.3f}; CPU time "
        f"{new['cpu'] / old['cpu']:.3f}; peak memory {new['peak'] / old['peak']:.3f}")
  diff = max((abs(a[k] - b[k]) for k in a if k in b), default=float("inf"))
  print(f"scores identical: {same} (largest difference {diff:.4f})")
  for k in sorted(a):
    print(f"  {k}: old {a[k]:.4f} new {b.get(k, float('nan')):.4f}")
  if a.keys() != b.keys() or diff > 0.005:
    raise SystemExit(1)


if __name__ == "__main__":
  main()
