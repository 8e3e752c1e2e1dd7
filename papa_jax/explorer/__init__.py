"""An attention explorer a researcher opens in a browser.

`write_explorer(workdir)` writes one self-contained `explorer.html` (data, JS
and CSS inlined; no server, no network) with the constant matrices, the head
ranking and schedule, the PAPA curves, a few dev examples' attention and context
mixing, and the effective and mixing stages' per-head statistics. See
`docs/explorer.md`.
"""

from papa_jax.explorer.page import ExplorerConfig, payload, render, run, write_explorer

__all__ = ["ExplorerConfig", "payload", "render", "run", "write_explorer"]
