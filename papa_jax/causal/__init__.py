"""Causal lenses: what attention and the residual stream cause (activation and attribution
patching, `patching.py`; attention knockout sweeps, `knockout.py`; metrics from a
checkpoint's MLM head or a workdir's probe, `metrics.py`; pair files, `pairs.py`)."""
