"""A synthetic timed server (pytest_dflash/refserver/synthetic.py) as a subprocess on 127.0.0.1, port 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

SYNTH_MODULE = "pytest_dflash.refserver.synthetic"


class Synth:
    """One running synth server; ``stats()`` is what it measured itself."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", SYNTH_MODULE, "--port", "0", *args], stdout=subprocess.PIPE,
                                     text=True, start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("LISTENING"):
            self.stop()
            raise RuntimeError(f"synth server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10) as resp:
            return json.loads(resp.read())

    def post(self, path: str) -> None:
        req = urllib.request.Request(self.url + path, data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self.get("/stats")
        return result

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def synth() -> Iterator[Callable[..., Synth]]:
    """Factory: ``synth("--ttft-ms", "20", …)`` starts a server, stopped after the test."""
    started: list[Synth] = []

    def start(*args: str) -> Synth:
        s = Synth(*args)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()
