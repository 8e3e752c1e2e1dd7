"""PAPA's controls on one task: head orderings and constant choices, with seeds and draws.

  python launch/main.py --config=configs/controls.py:task=sst2 --workdir=workdirs/controls_sst2
  python launch/main.py --config=configs/controls.py:task=sst2 --workdir=workdirs/controls_sst2 \
      --config.stage=report   # report.md with the controls section, under <workdir>/report

The CPU-sized PAPA run of configs/suite.py (all-MiniLM-L6-v2, a seeded train
subset of `train` examples, the CPU preset) with, beside PAPA's learned head
order, `draws` seeded random orders, the input-dependence orders (entropy,
variance and KL of each head's attention around its mean, from the means pass)
and the gradient importance order; and, beside the mean, the constant choices
uniform, row_mean and compressed (papa/constants.py). `seeds` probe seeds.
"""

from configs import base


def get_config(arg=None):
  a = base.parse_arg(arg, model="minilm", task="sst2", seeds=3, draws=5, train=2000,
                     sort_train=1000)
  c = base.cpu_preset(base.papa_config(a.model, a.task))
  c.data.max_train_examples = a.train
  c.sort.max_train_examples = a.sort_train
  c.papa.seeds = tuple(range(42, 42 + a.seeds))
  c.papa.orderings = ("lambda", "random", "entropy", "variance", "kl", "gradient")
  c.papa.random_draws = a.draws
  c.papa.variants = ("raw", "uniform", "row_mean", "compressed")
  c.run.cache_max_gb = 8.0
  c.run.log_every_steps = 100
  return c
