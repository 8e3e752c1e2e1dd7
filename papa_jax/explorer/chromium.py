"""Finding a headless Chromium for the explorer's screenshots and browser tests."""

from __future__ import annotations

import os
import shutil

# On a machine without network these flags stop Chromium from calling home (Playwright adds
# --headless and a fresh --user-data-dir).
CHROMIUM_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync")


def find_chromium() -> str | None:
  """`$PAPA_CHROMIUM`, else the first Chromium or Chrome on the PATH; None if there is none."""
  for name in (os.environ.get("PAPA_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
    if name and shutil.which(name):
      return shutil.which(name)
  return None
