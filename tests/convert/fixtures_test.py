"""Converter on the shared tiny random HF checkpoints (no torch needed).

The `reference_outputs.npz` next to each checkpoint were computed by Hugging
Face's PyTorch code (`shared/fixtures/tiny-random/make_tiny.py`).
"""

import numpy as np
import pytest

import papa_jax as pj
from tests.testing import require_shared

pytestmark = pytest.mark.unit

CHECKPOINTS = [
    "bert/BertModel", "bert/BertForMaskedLM", "roberta/RobertaModel",
    "roberta/RobertaForMaskedLM", "deberta/DebertaModel",
    "deberta/DebertaForMaskedLM", "deberta-v2/DebertaV2Model",
    "deberta-v2/DebertaV2ForMaskedLM", "distilbert/DistilBertModel",
    "distilbert/DistilBertForMaskedLM", "electra/ElectraModel",
    "electra/ElectraForPreTraining",
]


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_convert_tiny_fixture_matches_reference(name):
  path = require_shared("fixtures", "tiny-random", name)
  ref = np.load(path / "reference_outputs.npz")
  model = pj.load_pretrained(str(path))
  out = model.apply(ref["input_ids"], ref["attention_mask"], capture_attention=True)
  n_attn = sum(k.startswith("attentions_") for k in ref.files)
  assert len(out.attentions) == n_attn == model.config.num_layers
  for i, a in enumerate(out.attentions):
    np.testing.assert_allclose(np.asarray(a), ref[f"attentions_{i}"], atol=1e-6)
  if "last_hidden_state" in ref.files:
    np.testing.assert_allclose(np.asarray(out.last_hidden_state),
                               ref["last_hidden_state"], atol=1e-5)
  assert len(out.hidden_states) == model.config.num_layers + 1
