"""Model families: one module each, one registry (`FAMILIES`).

A module here describes one Hugging Face family as a `Family` record (`family.py`): the
config.json `model_type`s it reads, its config.json -> `EncoderConfig` function, its
parameter rules (`rules.py`: which checkpoint tensor fills which parameter, how reshaped), the
base-model prefix of its task checkpoints, the Hugging Face PyTorch class the tests compare it
with, and the attention code path its models run. `hf_config` dispatches on `model_type`,
`hf_params` on `EncoderConfig.family`, and the tests derive their family lists from
`FAMILIES` (`tests/hf_oracle.py`: the random architectures, `ONE_PER_PATH`, `LAYOUTS`).

Adding a family is:
  1. one module here exporting its `Family` (helpers: `family.py`, `rules.py`);
  2. its entry in `FAMILIES` below;
  3. its oracle entry: random Hugging Face configs in `tests/hf_oracle.py` (`RANDOM_CONFIGS`,
     under the family's name, one architecture named after the family).
Then the parity, conversion, override, capture and mixing tests cover it (in the unit tier
when it brings a new `CodePath`, else in integration), and `tests/convert/families_test.py`
fails while step 3 is missing or a model_type is claimed twice. A family that needs what the
encoder cannot do yet needs `EncoderConfig` flags first (`papa_jax/models/`).
"""

from __future__ import annotations

from papa_jax.convert.families import (albert, bert, deberta, distilbert, electra, modernbert,
                                       mpnet, nomic_bert, roberta)
from papa_jax.convert.families.family import CodePath, Family

# The order is the tests' order: the first family of each code path stands for it.
FAMILIES: tuple[Family, ...] = (
    bert.BERT, roberta.ROBERTA, electra.ELECTRA, distilbert.DISTILBERT, deberta.DEBERTA,
    deberta.DEBERTA_V2, mpnet.MPNET, albert.ALBERT, modernbert.MODERNBERT,
    nomic_bert.NOMIC_BERT,
)
BY_MODEL_TYPE: dict[str, Family] = {t: f for f in FAMILIES for t in f.model_types}
BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}

__all__ = ["BY_MODEL_TYPE", "BY_NAME", "FAMILIES", "CodePath", "Family"]
