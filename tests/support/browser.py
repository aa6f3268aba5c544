"""A real browser for the self-tests that read a rendered page: Debian's chromium, headless. The HTML reports
build part of their page in JavaScript (pytest-html's table comes from a JSON blob), so only a browser shows
what a person sees. Tests skip without chromium unless DFLASH_REQUIRE_BROWSER is set (CI sets it: there a
missing browser is a failure, not a skip)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run")


def _chromium() -> str:
    """The chromium binary; skips the calling test when there is none, fails it when CI requires one."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("DFLASH_REQUIRE_BROWSER"):
            pytest.fail("DFLASH_REQUIRE_BROWSER is set but chromium is not installed (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium; CI sets DFLASH_REQUIRE_BROWSER)")
    return found


def _run(html_path: Path, extra: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    # a profile directory of its own: two runs at once (xdist workers) do not share, and lock, one
    with tempfile.TemporaryDirectory(prefix="dflash-chromium-") as profile:
        return subprocess.run([_chromium(), *FLAGS, f"--user-data-dir={profile}", *extra,
                               html_path.resolve().as_uri()],
                              capture_output=True, text=True, timeout=timeout_s, check=False)


def dump_dom(html_path: Path, *, timeout_s: float = 60) -> str:
    """The page's DOM after its scripts ran, as chromium --dump-dom serialises it."""
    done = _run(html_path, ["--dump-dom"], timeout_s)
    assert done.returncode == 0 and done.stdout.strip(), f"chromium --dump-dom failed: {done.stderr[-2000:]}"
    return done.stdout


def screenshot(html_path: Path, png_path: Path, *, width: int = 1400, height: int = 1000,
               timeout_s: float = 60) -> None:
    """A PNG of the page as chromium draws it at width x height."""
    png_path.parent.mkdir(parents=True, exist_ok=True)
    done = _run(html_path, [f"--window-size={width},{height}", f"--screenshot={png_path.resolve()}"], timeout_s)
    assert done.returncode == 0 and png_path.is_file(), f"chromium --screenshot failed: {done.stderr[-2000:]}"
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{png_path} is not a PNG"


class _Body(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.attrs: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "body":
            self.attrs = {k: v or "" for k, v in attrs}


def measured_body(html_path: Path, script: str, *, timeout_s: float = 120) -> dict[str, str]:
    """The page with `script` put before </body> (it measures what Chromium rendered and writes the numbers as
    attributes of <body>), rendered: those attributes."""
    measured = html_path.with_name(f"measured-{html_path.name}")
    measured.write_text(html_path.read_text().replace("</body>", script + "</body>", 1))
    body = _Body()
    body.feed(dump_dom(measured, timeout_s=timeout_s))
    return body.attrs
