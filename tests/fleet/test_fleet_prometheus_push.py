"""--prometheus-push (pytest and `pytest-dflash merge`): prometheus_client's push_to_gateway against a real
HTTP server on loopback that records what it receives, as a Pushgateway would; failures are one line."""

from __future__ import annotations

import base64
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from support.fleet_helpers import BROKEN, GREEN, make_verdict
from support.promparse import parse

from pytest_dflash.cli import main
from pytest_dflash.fleet import prometheus
from pytest_dflash.fleet import summary as fleet
from pytest_dflash.fleet import verdicts as fleet_verdicts

FLEET_TEST = """
import pytest

@pytest.mark.host
def test_host(dflash_host):
    assert dflash_host.name != "gpu-b", "host check failed"
"""
PROFILE = '[host]\nconnection = "local://"\n\n[services.dflash]\nkind = "external"\nalgorithm = "DFLASH"\n' \
          'url = "http://127.0.0.1:9"\n'


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: str


@dataclass
class Gateway:
    """A tiny Pushgateway stand-in: records every request, answers `status`; `hold` makes it not answer."""

    url: str
    requests: list[Received] = field(default_factory=list)
    status: int = 200
    hold: threading.Event | None = None


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    state = Gateway(url="")

    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode("utf-8")
            state.requests.append(Received(self.command, self.path, dict(self.headers.items()), body))
            if state.hold is not None:
                state.hold.wait(30)
            self.send_response(state.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_PUT = do_POST = _record

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)  # listening on return; port 0 = any free port
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="pushgateway", daemon=True)
    thread.start()
    yield state
    if state.hold is not None:
        state.hold.set()
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def verdicts(tmp_path: Path) -> Path:
    make_verdict(tmp_path / "in", "gpu-a", GREEN, metrics={"perf": {"dflash": {"output_throughput": 812.5}}})
    make_verdict(tmp_path / "in", "gpu-b", BROKEN)
    return tmp_path / "in"


def test_merge_pushes_the_same_metrics_it_writes(verdicts: Path, tmp_path: Path, gateway: Gateway,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fleet"
    assert main(["merge", str(verdicts), "--out", str(out), "--prometheus-push", gateway.url]) == 1
    (request,) = gateway.requests
    assert (request.method, request.path) == ("PUT", "/metrics/job/pytest-dflash")
    assert request.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert parse(request.body) == parse((out / "fleet.prom").read_text())
    assert parse(request.body)["dflash_host_pass"].value(host="gpu-b") == 0
    assert f"pushed to {gateway.url}/metrics/job/pytest-dflash" in capsys.readouterr().out


def test_a_group_url_and_basic_auth(verdicts: Path, tmp_path: Path, gateway: Gateway) -> None:
    url = gateway.url.replace("http://", "http://ci:s3cret@") + "/metrics/job/nightly/shard/2"
    assert main(["merge", str(verdicts), "--out", str(tmp_path / "fleet"), "--prometheus-push", url, "-q"]) == 1
    (request,) = gateway.requests
    assert request.path == "/metrics/job/nightly/shard/2"
    assert request.headers["Authorization"] == "Basic " + base64.b64encode(b"ci:s3cret").decode()


@pytest.mark.parametrize(
    ("url", "path", "grouping"),
    [
        ("http://pgw:9091", "http://pgw:9091", {}),
        ("pgw:9091/metrics/job/nightly", "http://pgw:9091", {}),
        ("https://pgw/prefix/metrics/job/j/shard/2/rack/r7", "https://pgw/prefix", {"shard": "2", "rack": "r7"}),
        ("http://pgw/metrics/job@base64/L3Zhci9qb2I/path@base64/YS9i", "http://pgw", {"path": "a/b"}),
    ],
)
def test_push_url_forms(url: str, path: str, grouping: dict[str, str]) -> None:
    gateway, _job, key, auth, _shown = prometheus._push_target(url)
    assert (gateway, key, auth) == (path, grouping, None)


@pytest.mark.parametrize("url", ["ftp://pgw", "http://pgw/other/path", "http://pgw/metrics/job", "http://pgw:x"])
def test_a_malformed_push_url_is_a_usage_error(verdicts: Path, tmp_path: Path, url: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["merge", str(verdicts), "--out", str(tmp_path / "fleet"), "--prometheus-push", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pytest-dflash merge: error: --prometheus-push ") and err.count("\n") == 1
    assert not (tmp_path / "fleet").exists(), "nothing written on bad input"


def test_a_refused_push_is_exit_3_after_the_files_are_written(verdicts: Path, tmp_path: Path, gateway: Gateway,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    gateway.status = 500
    url = gateway.url.replace("http://", "http://ci:s3cret@")
    assert main(["merge", str(verdicts), "--out", str(tmp_path / "fleet"), "--prometheus-push", url, "-q"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("pytest-dflash merge: error: --prometheus-push http://***@127.0.0.1:")
    assert "HTTP 500" in err and "s3cret" not in err
    assert (tmp_path / "fleet" / "fleet.prom").is_file()


def test_an_unreachable_gateway_is_one_line(verdicts: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    closed = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = closed.server_address[1]
    closed.server_close()  # nothing listens on this port now: connection refused
    assert main(["merge", str(verdicts), "--out", str(tmp_path / "fleet"), "--prometheus-push",
                 f"http://127.0.0.1:{port}", "-q"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Connection refused" in err


def test_a_gateway_that_never_answers_is_bounded(verdicts: Path, gateway: Gateway) -> None:
    gateway.hold = threading.Event()
    loaded, excluded = fleet_verdicts.load_verdicts([verdicts])
    summary = fleet.build_summary(loaded, excluded=excluded)
    with pytest.raises(prometheus.PushError, match=r"^http://127\.0\.0\.1:\d+/metrics/job/pytest-dflash: .*timed out"):
        prometheus.push(gateway.url, summary, timeout_s=0.5)
    assert len(gateway.requests) == 1


def _fleet(pytester: pytest.Pytester) -> Path:
    pytester.makepyfile(test_fleet_hosts=FLEET_TEST)
    hosts = pytester.path / "fleet"
    hosts.mkdir()
    for name in ("gpu-a", "gpu-b"):
        (hosts / f"{name}.toml").write_text(PROFILE)
    return hosts


def test_a_pytest_run_pushes_its_fleet_metrics(pytester: pytest.Pytester, gateway: Gateway) -> None:
    hosts = _fleet(pytester)
    url = f"{gateway.url}/metrics/job/nightly/shard/1"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fleet", str(hosts),
                                           f"--dflash-report={pytester.path / 'reports'}", "--prometheus-push", url)
    assert result.ret == 1, result.stdout.str()
    result.stdout.fnmatch_lines([f"prometheus push: {url}"])
    (request,) = gateway.requests
    assert request.method == "PUT" and request.path == "/metrics/job/nightly/shard/1"
    assert parse(request.body) == parse((pytester.path / "reports" / "fleet.prom").read_text())


def test_a_failed_push_in_a_run_is_one_line_and_keeps_the_exit_code(pytester: pytest.Pytester,
                                                                     gateway: Gateway) -> None:
    gateway.status = 503
    hosts = _fleet(pytester)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fleet", str(hosts),
                                           f"--dflash-report={pytester.path / 'reports'}",
                                           "--prometheus-push", gateway.url)
    assert result.ret == 1  # gpu-b's failure, not the push
    result.stdout.fnmatch_lines([f"dflash: prometheus push failed: {gateway.url}/metrics/job/pytest-dflash: HTTP 503 *"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_a_malformed_push_url_stops_the_run_with_exit_4(pytester: pytest.Pytester) -> None:
    hosts = _fleet(pytester)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fleet", str(hosts),
                                           "--prometheus-push", "ftp://pgw")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["ERROR: --prometheus-push / dflash_prometheus_push: 'ftp://pgw': expected a "
                                 "Pushgateway URL*"])


def test_a_gateway_that_drips_its_answer_is_bounded_in_total(verdicts: Path) -> None:
    """urllib's timeout is per socket read: a gateway that sends a header line every 0.2 s never trips it, and
    once held the merge for ever. The push's timeout is its total time."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def drip() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            while not stop.wait(0.2):
                conn.sendall(b"X-Drip: 1\r\n")

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    loaded, excluded = fleet_verdicts.load_verdicts([verdicts])
    summary = fleet.build_summary(loaded, excluded=excluded)
    started = time.monotonic()
    try:
        with pytest.raises(prometheus.PushError, match=r"^http://127\.0\.0\.1:\d+/metrics/job/pytest-dflash: "
                                                       r"timed out \(the push's total time, 1s\)$"):
            prometheus.push(f"http://127.0.0.1:{server.getsockname()[1]}", summary, timeout_s=1.0)
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()
    assert time.monotonic() - started < 3
