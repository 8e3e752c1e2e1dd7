"""RoBERTa, and the families that share its architecture (XLM-R, CamemBERT): BERT's tensors,
positions counted from the padding id, byte-level BPE."""

from __future__ import annotations

from typing import Any

from papa_jax.convert.families.bert import bert_rules
from papa_jax.convert.families.family import ABSOLUTE, LM_HEAD, Family, absolute_fields
from papa_jax.models.config import EncoderConfig


def config(cfg: dict[str, Any], name: str) -> EncoderConfig:
  fields = absolute_fields(cfg, name, "roberta")
  # PAPA's recipe: no probe dropout for RoBERTa.
  fields.update(position_ids="from_padding", probe_dropout=0.0, add_prefix_space=True)
  return EncoderConfig(**fields)


ROBERTA = Family(name="roberta", model_types=("roberta", "xlm-roberta", "camembert"),
                 config=config, rules=bert_rules, base_prefix="roberta",
                 oracle_class="RobertaModel", code_path=ABSOLUTE, mlm_head=LM_HEAD)
