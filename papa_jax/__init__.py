"""papa_jax: how much does attention in pretrained transformers matter?

PAPA (constant attention probes) and effective attention, in JAX/Flax. The
public API: load an encoder, run it with an attention override or an
intervention at a named site, capture its per-layer intermediates, compute
constant matrices (attention means) and effective attention, read a finished
workdir's results.
"""

from papa_jax import interventions
from papa_jax.api import (attention_means, context_mixing, effective_attentions, encode_texts,
                          load_results)
from papa_jax.attention import AttentionOverride
from papa_jax.causal.knockout import knockout
from papa_jax.causal.patching import Targets, attribution_patch, patch
from papa_jax.convert import Pretrained, load_pretrained
from papa_jax.measures.effective import effective_attention, null_attention
from papa_jax.interventions import (Add, EffectiveAttention, HeadAblation, HeadMask, Knockout,
                                     Patch, StopGradient, Transform, ValueZeroing)
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import Capture, Encoder, EncoderOutput, LayerIntermediates
from papa_jax.papa.schedule import head_mask_from_ranking, ranking_from_lambdas, static_head_counts
from papa_jax.reader import FinishedWorkdir, read_workdir

__all__ = [
    "Add", "AttentionOverride", "Capture", "EffectiveAttention", "Encoder", "EncoderConfig",
    "EncoderOutput", "FinishedWorkdir", "HeadAblation", "HeadMask", "Knockout",
    "LayerIntermediates", "Patch", "Pretrained", "StopGradient", "Targets", "Transform",
    "ValueZeroing",
    "attention_means", "attribution_patch", "context_mixing", "effective_attention",
    "effective_attentions", "encode_texts", "head_mask_from_ranking", "interventions", "knockout",
    "load_pretrained", "load_results", "null_attention", "patch", "ranking_from_lambdas",
    "read_workdir", "static_head_counts",
]
__version__ = "0.1.0"
