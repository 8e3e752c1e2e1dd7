"""An experiment suite: PAPA on a grid of models x tasks, with seeds and the report.

  python launch/main.py \
      --config=configs/suite.py:models=minilm+minilm_sre,tasks=sst2+cola+mrpc+ner+pos \
      --workdir=workdirs/suite
  python launch/main.py --config=configs/suite.py:... --workdir=workdirs/suite --config.stage=report

Each cell runs in <workdir>/<model>__<task> (reused and resumed like any
workdir), then `report/` gets report.md/.json/.csv and figures. models: minilm
(all-MiniLM-L6-v2), minilm_sre (its fine-tune in the sre-embedding-model
package), any key of configs/base.py's MODELS, a hub id or a directory (use
'+' between models). Defaults are CPU-sized, like the quickstart: 3 probe
seeds, a seeded train subset (`train`, default 2000), full dev sets, 64 tokens
for single sentences and CoNLL sentences (they are short), 128 for pairs.
Per-task data directories: --config.suite.data_dirs.<task>=DIR ('' = shared).
"""

import ml_collections

from configs import base


def get_config(arg=None):
  a = base.parse_arg(arg, models="minilm+minilm_sre", tasks="sst2+cola+mrpc+ner+pos",
                     seeds=3, train=2000, sort_train=1000)
  c = base.get_config()
  c.stage = "suite"
  c.model.name = ""  # Set per cell.
  models = tuple(a.models.split("+"))  # Keys name the cells; papa_jax.suite resolves them.
  tasks = tuple(a.tasks.split("+"))
  c.suite = ml_collections.ConfigDict(dict(
      models=models, tasks=tasks,
      max_length=ml_collections.ConfigDict({t: base.max_length(t) for t in tasks}),
      data_dirs=ml_collections.ConfigDict({t: "" for t in tasks}),
      shard="",  # "I/N": every N-th cell from the I-th (1-based), for N machines.
  ))
  c.papa.seeds = tuple(range(42, 42 + a.seeds))
  c.data.max_train_examples = a.train
  base.cpu_preset(c)
  c.run.cache_max_gb = 8.0
  c.sort.max_train_examples = a.sort_train
  c.run.log_every_steps = 100
  return c
