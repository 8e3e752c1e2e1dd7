"""papa_jax: how much does attention in pretrained transformers matter?

PAPA (constant attention probes) and effective attention, in JAX/Flax.
"""

from papa_jax.attention import AttentionOverride
from papa_jax.convert import Pretrained, load_pretrained, packaged_model_dir
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import Encoder, EncoderOutput

__all__ = [
    "AttentionOverride", "Encoder", "EncoderConfig", "EncoderOutput",
    "Pretrained", "load_pretrained", "packaged_model_dir",
]
__version__ = "0.1.0"
