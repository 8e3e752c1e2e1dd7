"""BERT: absolute position and segment embeddings, post-LayerNorm layers."""

from __future__ import annotations

from typing import Any

from papa_jax.convert.families import rules
from papa_jax.convert.families.family import ABSOLUTE, Family, MLMHeadNames, absolute_fields
from papa_jax.models.config import EncoderConfig


def config(cfg: dict[str, Any], name: str) -> EncoderConfig:
  return EncoderConfig(**absolute_fields(cfg, name, "bert"))


def bert_rules(c: EncoderConfig, layer_groups=None) -> list[rules.Rule]:
  del layer_groups  # Every layer has its own tensors.
  return rules.embeddings(c) + rules.bert_layers(c)


BERT = Family(name="bert", model_types=("bert",), config=config, rules=bert_rules,
              base_prefix="bert", oracle_class="BertModel", code_path=ABSOLUTE,
              mlm_head=MLMHeadNames("cls.predictions.transform.dense",
                                    "cls.predictions.transform.LayerNorm",
                                    "cls.predictions.decoder", "cls.predictions.bias"))
