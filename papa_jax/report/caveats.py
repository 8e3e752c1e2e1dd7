"""What the report's tables do not show, derived from its numbers (report.md's last section)."""

from __future__ import annotations

from papa_jax import significance
from papa_jax.report import claims as report_claims
from papa_jax.report.markdown import number


def caveats(results: list[dict], averages: list[dict], corr: dict, multi: dict,
             level: float, tested: list[dict]) -> list[str]:
  """What the tables do not show, derived from the numbers."""
  out, lv = [], f"{100 * level:.0f}%"
  left = [f"{r['model']}/{r['task']} ({r['check']['reason']})" for r in results
          if r["check"] and not report_claims.informative(r)]
  if left:
    out.append("Left out of every claim (per-model averages, the comparison with the "
               "paper's 8%, the correlation, the counts below) as uninformative (the baseline "
               "probe is not clearly above the best constant prediction) or not checked: "
               + "; ".join(left) + ".")
  c = corr.get("raw")
  w = next((t for t in tested if t["kind"] == report_claims.CORRELATION), None)
  if w is not None and w["verdict"] == "not tested":
    out.append(f"Better models lose more? Not tested: n = {w['n']} informative (model, task) "
               f"pairs in tasks with {report_claims.MIN_PAIRS_PER_TASK} or more models < "
               f"{significance.N_MIN_PAIRS}.")
  if c is not None and c["verdict"] != "not tested" and len({p["task"] for p in c["pairs"]}) > 1:
    out.append("The correlation across tasks (secondary, beside the claim) pools tasks ("
               + ", ".join(sorted({p["metric"] for p in c["pairs"]})) + "): differences in "
               "scale and difficulty between tasks can produce it on their own, so the claim's "
               "verdict uses the correlation within each task, pooled.")
  split = [f"'{t['claim']}' is {t['verdict']} given these cells but {t['general']['verdict']} "
           f"with the {t['general']['resampled']} resampled" for t in tested
           if t["general"]["verdict"] not in ("not tested", t["verdict"])]
  out.append("Each claim has two intervals: given these cells (dev examples and probe seeds "
             "resampled within each (model, task) cell), and over cells (the cells, or for "
             "the correlation the tasks, resampled too: would the verdict hold for other "
             "models and tasks like these?). " + ("; ".join(split) + ": that verdict rests on "
             "which models and tasks were run." if split else "Both verdicts agree for "
             "every claim tested."))
  sizes: dict[str, set] = {}
  for r in results:
    if report_claims.informative(r) and r["train_examples"]:
      sizes.setdefault(r["model"], set()).add(r["train_examples"])
  if len({n for v in sizes.values() for n in v}) > 1:
    out.append("The informative cells' probes and means used different train subsets ("
               + "; ".join(f"{m}: {', '.join(map(str, sorted(v)))} examples"
                           for m, v in sizes.items())
               + "): averages over cells and the correlation compare models under different "
               "recipes, and a drop can differ with the subset size alone.")
  out += _leave_one_model_out(tested)
  rows = report_claims.family(results)
  noisy = [f"{r['model']}/{r['task']} {x['variant']} {x['fraction_label']}" for r, x in rows
           if x["within_noise"]]
  out.append(f"{len(noisy)} of {len(rows)} relative drops in the main table (informative "
             f"cells) have a {lv} interval containing 0 (within noise)"
             + (": " + "; ".join(noisy) if noisy else "") + f"; after Holm's adjustment over "
             f"the {multi['n_tests']} tests (these drops and the per-model averages over "
             "several tasks), "
             f"{multi['within_noise_adjusted']} of {multi['n_tests']} are within noise.")
  flat = [a for a in averages if a["within_noise"]]
  if flat:
    out.append("Per-model average drops within noise: " + "; ".join(
        f"{a['model']} {a['variant']} {a['heads']} heads" for a in flat) + ".")
  seeds = [x["n"] for r in results for x in r["conditions"]]
  if 1 in seeds:
    out.append("Some conditions have one seed: no seed spread (std \"–\"); their intervals "
               "reflect dev-set sampling only.")
  few = [n for n in seeds if 1 < n < 5]
  if few:
    out.append(f"As few as {min(few)} seeds per condition: the seed part of each interval "
               "rests on that many values and is narrower than the seed noise it stands for.")
  task_sets = {(a["variant"], a["heads"]): set() for a in averages}
  for a in averages:
    task_sets[a["variant"], a["heads"]].add(tuple(sorted(a["tasks"])))
  if any(len(t) > 1 for t in task_sets.values()):
    out.append("Per-model averages cover different task sets (see the tasks column), so they "
               "are not directly comparable between models.")
  logged = [f"{r['model']}/{r['task']} {x['variant']} {x['fraction_label']}" for r in results
            for x in r["conditions"] if x["source"] == "logged"]
  if logged:
    out.append("No predictions, so no interval, for: " + "; ".join(logged) + ".")
  undefined = sorted({f"{r['model']}/{r['task']}" for r in results for x in r["conditions"]
                      if "relative_drop" in x and x["within_noise"] is None
                      and x.get("relative_drop_ci") is not None})
  undefined += [f"{r['model']}/{r['task']}" for r in results
                if r["baseline"] and not r["baseline"]["mean"] > 0 and
                f"{r['model']}/{r['task']}" not in undefined]
  if undefined:
    out.append("Relative drop undefined (baseline <= 0, on the dev set or in some resamples; "
               "never counted as within noise) for: " + "; ".join(undefined) + ".")
  missing = [f"{r['model']}/{r['task']} {s['variant']} {w} heads" for r in results
             for s in r["summary"] for w in ("all", "half") if s[w] is None]
  missing += [f"{r['model']}/{r['task']} baseline" for r in results if r["baseline"] is None]
  if missing:
    out.append("Not run (shown as \"–\"): " + "; ".join(missing) + ".")
  out.append("Intervals cover dev-set sampling and probe seeds only. The constant matrices "
             "(one pass over a train subset), the head order (one sorting run), the train "
             "subset and the encoder are held fixed; their variability is not included.")
  return out


def _leave_one_model_out(tested: list[dict]) -> list[str]:
  """Whether a claim's verdict rests on one model: the verdicts that change when one
  model's cells are left out."""
  if not any(c.get("without") for c in tested):
    return []
  changed = []
  for c in tested:
    parts = []
    for m, w in c.get("without", {}).items():
      if w["verdict"] != c["verdict"]:
        pct = c["percent"]
        est = "" if w["estimate"] is None else f": {number(w['estimate'], pct)}" + (
            "" if w["ci"] is None else f" [{number(w['ci'][0], pct)}, {number(w['ci'][1], pct)}]")
        parts.append(f"without {m}, {w['verdict']} ({w['n']} cells{est})")
    if parts:
      changed.append(f"'{c['claim']}' is {c['verdict']} with all models; " + "; ".join(parts))
  if not changed:
    return ["Leaving one model out, no claim's verdict changes."]
  return ["Leaving one model out: " + ". ".join(changed) + ". A verdict that one model "
          "decides rests on that model's cells and recipe."]
