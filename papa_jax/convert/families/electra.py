"""ELECTRA: BERT with embeddings of their own width, projected (with a bias) to the hidden
size after their dropout."""

from __future__ import annotations

from typing import Any

from papa_jax.convert.families import rules
from papa_jax.convert.families.family import ABSOLUTE, Family, absolute_fields
from papa_jax.models.config import EncoderConfig


def config(cfg: dict[str, Any], name: str) -> EncoderConfig:
  fields = absolute_fields(cfg, name, "electra")
  fields["embedding_size"] = cfg.get("embedding_size", cfg["hidden_size"])
  fields["embedding_projection"] = (
      "after_dropout" if fields["embedding_size"] != cfg["hidden_size"] else "none")
  return EncoderConfig(**fields)


def electra_rules(c: EncoderConfig, layer_groups=None) -> list[rules.Rule]:
  del layer_groups
  return rules.embeddings(c, "embeddings_project", proj_bias=True) + rules.bert_layers(c)


ELECTRA = Family(name="electra", model_types=("electra",), config=config, rules=electra_rules,
                 base_prefix="electra", oracle_class="ElectraModel", code_path=ABSOLUTE)
