"""The synthetic server's --reuse-port: several server processes behind one URL, so a client benchmark
(benchmarks/client_procs.py --server-procs K) measures the client, not one server process's event loop."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

SynthFactory = Callable[..., Any]  # conftest.Synth: .url, .stop()


def models(url: str) -> int:
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:
        return int(resp.status)


def test_two_processes_share_a_port_and_either_serves_it(synth: SynthFactory) -> None:
    first = synth("--reuse-port")
    port = first.url.rsplit(":", 1)[1]
    second = synth("--reuse-port", "--port", port)
    assert second.url == first.url
    first.stop()  # the port is still served: by the second process
    assert models(second.url) == 200


def test_without_reuse_port_the_second_process_cannot_bind(synth: SynthFactory) -> None:
    first = synth()
    with pytest.raises(RuntimeError, match="did not start"):
        synth("--port", first.url.rsplit(":", 1)[1])
