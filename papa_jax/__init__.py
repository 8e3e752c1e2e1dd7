"""papa_jax: how much does attention in pretrained transformers matter?

PAPA (constant attention probes) and effective attention, in JAX/Flax. The
public API: load an encoder, run it with an attention override, compute
constant matrices (attention means) and effective attention, read a finished
workdir's results.
"""

from papa_jax.analysis.effective import effective_attention, effective_probs_fn, null_attention
from papa_jax.api import attention_means, effective_attentions, encode_texts, load_results
from papa_jax.attention import AttentionOverride
from papa_jax.convert import Pretrained, load_pretrained
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import Encoder, EncoderOutput
from papa_jax.papa.schedule import head_mask_from_ranking, ranking_from_lambdas, static_head_counts

__all__ = [
    "AttentionOverride", "Encoder", "EncoderConfig", "EncoderOutput", "Pretrained",
    "attention_means", "effective_attention", "effective_attentions", "effective_probs_fn",
    "encode_texts",
    "head_mask_from_ranking", "load_pretrained", "load_results", "null_attention",
    "ranking_from_lambdas", "static_head_counts",
]
__version__ = "0.1.0"
