"""Headless Chromium screenshots of the self-contained HTML pages graphmod
writes (graphmod diff, graphmod.verify), read back as pixels."""
import subprocess

import numpy as np
import tensorflow as tf


def screenshot(page, png) -> np.ndarray:
    """A headless Chromium screenshot of a local page (flags as this machine
    needs them: no sandbox as root, no background network), as RGB pixels."""
    profile = png.parent / "chromium-profile"
    done = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={profile}", "--hide-scrollbars",
         "--window-size=1400,1000", f"--screenshot={png}", f"file://{page}"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and png.exists(), done.stderr[-2000:]
    return tf.io.decode_png(png.read_bytes()).numpy()[:, :, :3].astype(int)


def share(pixels: np.ndarray, color: str) -> float:
    """The share of the pixels in one colour ('#rrggbb', within 6 levels)."""
    rgb = np.array([int(color[i:i + 2], 16) for i in (1, 3, 5)])
    return float((np.abs(pixels - rgb).sum(-1) <= 6).mean())
