"""PAPA on one model and task of the paper's grid, with the paper's recipe.

  python launch/main.py --config=configs/papa.py:model=roberta_large,task=mnli --workdir=DIR

model: bert, bert_large, roberta, roberta_large, deberta, deberta_large (the
paper's six), minilm, or any hub id / local model directory; task: cola, sst2,
mrpc, qnli, mnli, ner (any built-in task works). Defaults: model=bert,
task=sst2. Every field can still be overridden, e.g. --config.probe.epochs=3.
"""

from configs import base


def get_config(arg=None):
  a = base.parse_arg(arg, model="bert", task="sst2")
  return base.papa_config(a.model, a.task)
