"""Debian's Chromium, headless, as the self-tests' browser: the DOM a page has after its scripts ran, and a
screenshot of it. `chromium` must be on PATH (the tests skip without it unless DFLASH_REQUIRE_BROWSER is set)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

CHROMIUM = "chromium"
_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run")


def _run(html_path: Path, extra: list[str], timeout_s: float) -> str:
    # a profile directory of its own: two runs at once do not share (and lock) one
    with tempfile.TemporaryDirectory(prefix="dflash-chromium-") as profile:
        done = subprocess.run([CHROMIUM, *_FLAGS, f"--user-data-dir={profile}", *extra,
                               html_path.resolve().as_uri()],
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"chromium exited {done.returncode} on {html_path}: {done.stderr[-2000:]}")
    return done.stdout


def dump_dom(html_path: Path, *, timeout_s: float = 60) -> str:
    """The page's DOM as Chromium serializes it after loading it and running its scripts."""
    return _run(html_path, ["--dump-dom"], timeout_s)


def screenshot(html_path: Path, png_path: Path, *, width: int = 1400, height: int = 1000,
               timeout_s: float = 60) -> None:
    """A PNG of the page's first `width` x `height` pixels."""
    png_path.parent.mkdir(parents=True, exist_ok=True)
    _run(html_path, [f"--window-size={width},{height}", f"--screenshot={png_path.resolve()}"], timeout_s)
    if not png_path.is_file() or png_path.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
        raise RuntimeError(f"chromium wrote no PNG to {png_path}")
