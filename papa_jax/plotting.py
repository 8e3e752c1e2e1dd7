"""matplotlib on the Agg backend, and one way to save a figure (atomically)."""

from __future__ import annotations

import io

from papa_jax.workdir import rules as workdir


def pyplot():
  """matplotlib.pyplot on the Agg backend (no display needed)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def save_figure(fig, path: str, *, tight: bool = True) -> None:
  """Saves `fig` as a PNG at `path` (atomically: a killed run leaves no half file), closes it."""
  plt = pyplot()
  if tight:
    fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format="png")
  plt.close(fig)
  with workdir.atomic_write(path, "wb") as f:
    f.write(buf.getvalue())
