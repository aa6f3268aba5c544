"""Verdict fuzz: real pytest runs of a small dflash suite against real refserver processes, driven through the
run shapes a hostile user (or a flaky CI runner) produces, and checked against the invariants a deploy gate
relies on:

- the exit code is the documented one (docs/gating.md "Exit codes by run shape" is generated from SHAPES);
- every host the run names has a verdict file, and that file is consistent with itself (what `merge` checks);
- a host's verdict is `pass` only in a whole, healthy run; a crash, a rerun, a filter or a signal never gives one;
- `--gate` passes and `pytest-dflash merge` exits 0 only when every host the run named passed.

tests/e2e/test_verdict_fuzz_e2e.py runs a seeded sample of the shapes in CI (`DFLASH_FUZZ_SEED` picks the
sample; the seed is printed); benchmarks/verdict_fuzz.py runs every shape.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pytest_dflash.cli import main as cli_main
from pytest_dflash.fleet.verdicts import inconsistency

ROOT = Path(__file__).parents[2]
HOSTS = ("alpha", "beta")
STALE = {"schema": "pytest-dflash/verdict/1", "verdict": "pass", "tests_verdict": "pass", "complete": True,
         "interrupted": None, "partial": [], "exit_code": 0, "layers": {}, "failures": [], "blocked": []}

CONFTEST = '''
import os, signal, time
from pathlib import Path

import pytest


def mark(what):
    with open(os.environ["FUZZ_MARKS"], "a") as out:
        out.write(f"{what}\\n")


def linger(phase):
    if os.environ.get("FUZZ_LINGER") == phase:
        mark(f"lingering {phase}")
        time.sleep(120)


def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        mark("configure")
        linger("configure")


class Boom:
    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config):  # before the plugin's start-of-run verdicts
        raise RuntimeError("FUZZ_BOOM: a conftest's pytest_configure raised")


def pytest_addoption(parser, pluginmanager):
    if os.environ.get("FUZZ_BOOM") == "configure":
        pluginmanager.register(Boom(), "fuzz-boom")


def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):
        mark("collection")
        linger("collection")
    drop = os.environ.get("FUZZ_DROP")
    if drop:  # a conftest that drops tests silently: no pytest_deselected call
        items[:] = [item for item in items if drop not in item.nodeid]
    xfail = os.environ.get("FUZZ_XFAIL")
    if xfail:  # a conftest that marks a failing check xfail
        for item in items:
            if xfail in item.nodeid:
                item.add_marker(pytest.mark.xfail(reason="known"))
    skip = os.environ.get("FUZZ_SKIP")
    if skip:  # a conftest that skips a failing check
        for item in items:
            if skip in item.nodeid:
                item.add_marker(pytest.mark.skip(reason="known flaky"))


def pytest_pycollect_makeitem(collector, name, obj):
    if name == os.environ.get("FUZZ_UNMADE"):  # a conftest that makes a check no test at all
        return []


def pytest_collection_finish(session):
    if os.environ.get("FUZZ_BOOM") == "collection":
        raise RuntimeError("FUZZ_BOOM: a conftest hook raised")


@pytest.fixture(autouse=True)
def fuzz_hooks(request):
    nodeid = request.node.nodeid
    mark(f"test {nodeid}")
    kill = os.environ.get("FUZZ_KILL_WORKER")
    flag = Path(os.environ["FUZZ_MARKS"] + ".killed")
    if kill and kill in nodeid and os.environ.get("PYTEST_XDIST_WORKER") and not flag.exists():
        flag.write_text(nodeid)
        os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-test (an OOM kill, a segfault)
    linger("test")
    yield
    linger("teardown")
'''

SUITE = '''
import os
from pathlib import Path

import pytest
from pytest_dflash.api import ServiceHandle, greedy
from pytest_dflash.run import skips


def maybe_fail(request):
    failing = os.environ.get("FUZZ_FAIL")
    if failing and failing in request.node.nodeid:
        pytest.fail("FUZZ_FAIL says this test fails")
    flaky = os.environ.get("FUZZ_FLAKY")
    if flaky and flaky in request.node.nodeid:
        flag = Path(os.environ["FUZZ_MARKS"] + ".flaky-" + request.node.name.replace("/", "_"))
        if not flag.exists():
            flag.write_text("failed once")
            pytest.fail("FUZZ_FLAKY says this test fails once")


@pytest.mark.generation
def test_a(dflash_service: ServiceHandle, request) -> None:
    greedy(dflash_service.client, native=dflash_service.native)
    maybe_fail(request)


@pytest.mark.generation
def test_b(dflash_service: ServiceHandle, request) -> None:
    maybe_fail(request)


@pytest.mark.generation
def test_c(dflash_service: ServiceHandle, request) -> None:
    maybe_fail(request)


@pytest.mark.generation
def test_d(dflash_service: ServiceHandle, request) -> None:
    maybe_fail(request)


@pytest.mark.generation
def test_forced_tool_call(dflash_service: ServiceHandle, request) -> None:
    """The shapes of a forced tool call judged (the real check is layers/generation's): a call never made fails;
    arguments that cannot be validated on this controller could not be checked."""
    shape = os.environ.get("FUZZ_TOOL", "")
    if shape.startswith("unforced:") and shape.split(":", 1)[1] in request.node.nodeid:
        pytest.fail("forced tool call never made: finish 'length' after 32 tokens of text, no tool_calls")
    if shape.startswith("no-validator:") and shape.split(":", 1)[1] in request.node.nodeid:
        skips.could_not_check("the arguments of the forced call need jsonschema on the controller: "
                              "pip install 'pytest-dflash[structured]'")
'''


@dataclass
class Run:
    """One real pytest run of the fuzz suite, and what it left behind."""

    workdir: Path
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    returncode: int | None = None
    output: str = ""

    @property
    def reports(self) -> Path:
        return self.workdir / "reports"

    def verdict(self, host: str) -> dict[str, Any] | None:
        path = self.reports / f"{host}.verdict.json"
        return json.loads(path.read_text()) if path.is_file() else None


@dataclass(frozen=True)
class Shape:
    """A run shape: what the user does, and what the docs promise for it."""

    name: str
    what: str  # one line for docs/gating.md
    exit_codes: tuple[int, ...]  # the documented exit code(s); -9: killed, no exit code of its own
    verdict: str  # every host's verdict ('mixed': per host, in the shape's own checks)
    act: Callable[[Path, random.Random], Run]
    check: Callable[[Run], None] | None = None


# ---- building blocks ---------------------------------------------------------------------------------------


def setup(workdir: Path, hosts: Sequence[str] = HOSTS, extra: Mapping[str, list[str]] | None = None) -> list[str]:
    """The suite, one refserver profile per host, and a stale 'pass' verdict per host (what an earlier run left:
    it must never survive a run that names the host). Returns the --host arguments."""
    suite = workdir / "suite"
    suite.mkdir(parents=True, exist_ok=True)
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "test_fuzz.py").write_text(SUITE)
    (workdir / "reports").mkdir(exist_ok=True)
    args: list[str] = []
    for host in hosts:
        command = ["{python}", "-m", "pytest_dflash.refserver", "--host", "127.0.0.1", "--port", "{port}",
                   "--speculative-algorithm", "NONE", *(extra or {}).get(host, [])]
        (workdir / f"{host}.toml").write_text("\n".join([
            "[host]", 'connection = "local://"', f'python = "{sys.executable}"', 'provision = "always"', "",
            "[services.plain]", 'kind = "process"', 'algorithm = "NONE"', f"command = {json.dumps(command)}",
            'ready_timeout = "90s"', ""]))
        (workdir / "reports" / f"{host}.verdict.json").write_text(json.dumps({**STALE, "host": host}))
        args += ["--host", str(workdir / f"{host}.toml")]
    return args


def pytest_args(workdir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", str(workdir / "suite"), "-p", "no:cacheprovider", "-q",
            "--request-timeout=30s", f"--dflash-report={workdir / 'reports'}", *args]


def run_env(workdir: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "FUZZ_MARKS": str(workdir / "marks"), "DFLASH_STATE_DIR": str(workdir / "state"),
           "PYTHONUNBUFFERED": "1", **extra}
    env.pop("GITHUB_STEP_SUMMARY", None)
    for name in ("FUZZ_FAIL", "FUZZ_DROP", "FUZZ_LINGER", "FUZZ_KILL_WORKER", "FUZZ_XFAIL", "FUZZ_FLAKY",
                 "FUZZ_UNMADE", "FUZZ_BOOM", "FUZZ_SKIP", "FUZZ_TOOL", "PYTEST_ADDOPTS"):
        if name not in extra:
            env.pop(name, None)
    return env


def run_pytest(workdir: Path, args: Sequence[str], *, timeout_s: float = 300, cache: bool = False,
               **env: str) -> Run:
    command = pytest_args(workdir, *args)
    if cache:
        command.remove("no:cacheprovider")
        command.remove("-p")
    run = Run(workdir, command, env)
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=workdir,
                            env=run_env(workdir, **env))
    run.returncode, run.output = result.returncode, result.stdout + result.stderr
    return run


def run_and_signal(workdir: Path, args: Sequence[str], *, signum: int, when: Callable[[], bool],
                   timeout_s: float = 240, **env: str) -> Run:
    """Start the run, send `signum` to its process group once `when()` is true, wait for it to end."""
    command = pytest_args(workdir, *args)
    run = Run(workdir, command, env)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=workdir,
                            env=run_env(workdir, **env), start_new_session=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout or ()), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not when():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the run ended (or timed out) before its signal: {''.join(out)[-3000:]}")
            time.sleep(0.1)
        if signum == signal.SIGKILL:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.send_signal(signum)
        proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        reader.join(timeout=10)
        _reap(workdir)
    run.returncode, run.output = proc.returncode, "".join(out)
    return run


def _reap(workdir: Path) -> None:
    """A SIGKILLed run leaves its refservers running (the next run would reap them): stop them now."""
    for marker in (workdir / "state").rglob("*.json") if (workdir / "state").is_dir() else ():
        try:
            pid = int(json.loads(marker.read_text()).get("pid") or 0)
        except (ValueError, OSError, AttributeError):
            continue
        if pid > 1:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def marked(workdir: Path, prefix: str) -> Callable[[], bool]:
    path = workdir / "marks"
    return lambda: path.is_file() and any(line.startswith(prefix) for line in path.read_text().splitlines())


# ---- the invariants ----------------------------------------------------------------------------------------


def check_invariants(shape: Shape, run: Run, hosts: Sequence[str]) -> list[str]:
    """What must hold after every run shape (a list of broken promises; empty: all held)."""
    problems = []
    if run.returncode not in shape.exit_codes:
        problems.append(f"exit code {run.returncode}, documented {shape.exit_codes}")
    if 3 not in shape.exit_codes and ("INTERNALERROR" in run.output
                                      or "Traceback (most recent call last)" in run.output):
        problems.append("a traceback or INTERNALERROR in the output")
    verdicts = {}
    for host in hosts:
        data = run.verdict(host)
        if data is None:
            problems.append(f"{host}: no verdict file")
            continue
        verdicts[host] = data
        if data.get("run_id") is None:
            problems.append(f"{host}: the stale verdict of an earlier run still stands")
            continue
        if (why := inconsistency(data)) is not None:
            problems.append(f"{host}: inconsistent verdict: {why}")
        if shape.verdict != "mixed" and data["verdict"] != shape.verdict:
            problems.append(f"{host}: verdict {data['verdict']!r}, documented {shape.verdict!r} "
                            f"(interrupted={data.get('interrupted')!r}, partial={data.get('partial')!r})")
    all_pass = len(verdicts) == len(hosts) and all(v["verdict"] == "pass" for v in verdicts.values())
    if "--gate" in run.args and ("gate generation: PASSED" in run.output) != all_pass:
        problems.append(f"the gate said {'PASSED' if 'PASSED' in run.output else 'FAILED'} with verdicts "
                        f"{ {h: v['verdict'] for h, v in verdicts.items()} }")
    if run.reports.is_dir() and any(run.reports.glob("*.verdict.json")):
        merged = merge(run.reports, run.workdir / f"merged-{shape.name}")
        if (merged == 0) != all_pass:
            problems.append(f"merge exited {merged} with verdicts { {h: v['verdict'] for h, v in verdicts.items()} }")
    return problems


def merge(reports: Path, out: Path, *extra: str) -> int:
    """`pytest-dflash merge`, in this process, quietly."""
    with open(os.devnull, "w") as devnull:
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = devnull
        try:
            return cli_main(["merge", str(reports), "--out", str(out), "--quiet", *extra])
        finally:
            sys.stdout, sys.stderr = saved


# ---- the shapes ----------------------------------------------------------------------------------------------


def _healthy(w: Path, rng: random.Random) -> Run:
    return run_pytest(w, [*setup(w), "--gate", "generation"])


def _worker_sigkill(w: Path, rng: random.Random) -> Run:
    victim = rng.choice(["test_a", "test_b", "test_c", "test_d"]) + f"[{rng.choice(HOSTS)}"
    return run_pytest(w, [*setup(w), "-n", "2", "--gate", "generation"], FUZZ_KILL_WORKER=victim)


def _worker_sigkill_one(w: Path, rng: random.Random) -> Run:
    """`-n 1`: the only worker dies; its replacement must finish the run (xdist's loadgroup hung here)."""
    victim = rng.choice(["test_a", "test_b", "test_c", "test_d"]) + f"[{rng.choice(HOSTS)}"
    return run_pytest(w, [*setup(w), "-n", "1", "--gate", "generation"], timeout_s=240, FUZZ_KILL_WORKER=victim)


def _x(w: Path, rng: random.Random) -> Run:
    return run_pytest(w, [*setup(w), "-x"], FUZZ_FAIL=f"test_b[{rng.choice(HOSTS)}")


def _maxfail(w: Path, rng: random.Random) -> Run:
    return run_pytest(w, [*setup(w), "--maxfail", "1"], FUZZ_FAIL="test_c[")


def _stepwise(w: Path, rng: random.Random) -> Run:
    hosts = setup(w)
    first = run_pytest(w, [*hosts, "--sw"], cache=True, FUZZ_FAIL=f"test_{rng.choice('bcd')}[alpha")
    assert first.returncode in (1, 2), first.output[-2000:]  # stepwise stops at the failure, and remembers it
    return run_pytest(w, [*hosts, "--sw"], cache=True)


def _last_failed(w: Path, rng: random.Random) -> Run:
    hosts = setup(w)
    first = run_pytest(w, hosts, cache=True, FUZZ_FAIL="test_c[beta")
    assert first.returncode == 1, first.output[-2000:]
    return run_pytest(w, [*hosts, "--lf"], cache=True)


def _keyword(w: Path, rng: random.Random) -> Run:
    return run_pytest(w, [*setup(w), "-k", rng.choice(["not test_d", "test_a or test_b"])])


def _conftest_drop(w: Path, rng: random.Random) -> Run:
    return run_pytest(w, setup(w), FUZZ_DROP=rng.choice(["test_b[", "test_d[alpha"]))


def _collection_error(w: Path, rng: random.Random) -> Run:
    hosts = setup(w)
    (w / "suite" / "test_broken.py").write_text("import a_module_that_does_not_exist_for_the_fuzz\n")
    return run_pytest(w, [*hosts, "--continue-on-collection-errors", "--gate", "generation"])


def _gate_filter(w: Path, rng: random.Random) -> Run:
    return run_pytest(w, [*setup(w), "--gate", "generation", "-k", "not beta"])


def _check_gate_filter(run: Run) -> None:
    assert run.verdict("alpha")["verdict"] == "partial", run.verdict("alpha")  # type: ignore[index]
    assert run.verdict("beta")["verdict"] == "partial", run.verdict("beta")  # type: ignore[index]
    assert "gate generation: FAILED" in run.output, run.output[-2000:]


def _usage_error(w: Path, rng: random.Random) -> Run:
    return run_pytest(w, [*setup(w), rng.choice(["--gate= ", "--gate=nolayer", "--request-timeout=forever"])])


def _shard_missing(w: Path, rng: random.Random) -> Run:
    setup(w)
    fleet = w / "fleet"
    fleet.mkdir()
    for host in HOSTS:
        (fleet / f"{host}.toml").write_text((w / f"{host}.toml").read_text())
        (w / "reports" / f"{host}.verdict.json").unlink()
    from pytest_dflash.config.inventory import shard_of

    index = shard_of("alpha", 2)
    run = run_pytest(w, ["--fleet", str(fleet), "--shard", f"{index}/2"])
    run.args.append("--shard-merge")
    return run


def _check_shard_missing(run: Run) -> None:
    from pytest_dflash.config.inventory import shard_of

    ran = [h for h in HOSTS if run.verdict(h) is not None]
    assert ran and all(shard_of(h, 2) == shard_of("alpha", 2) for h in ran), ran
    assert all(run.verdict(h)["verdict"] == "pass" for h in ran), run.output[-2000:]  # type: ignore[index]
    code = merge(run.reports, run.workdir / "merged-shards", "--gate", "generation")
    missing = [h for h in HOSTS if h not in ran]
    if missing:  # the other shard's hosts: no verdict, and the merge must say so
        assert code == 1, f"merge of one shard of two exited {code}"
        summary = json.loads((run.workdir / "merged-shards" / "fleet-summary.json").read_text())
        assert all(summary["hosts"][h]["verdict"] == "interrupted" for h in missing), summary["hosts"].keys()


@dataclass
class NamedRun(Run):
    """A run whose hosts are not HOSTS: their names, and their verdict files under the plugin's encoding."""

    named: tuple[str, ...] = ()

    def verdict(self, host: str) -> dict[str, Any] | None:
        from pytest_dflash.config.targets import file_name

        path = self.reports / f"{file_name(host)}.verdict.json"
        return json.loads(path.read_text()) if path.is_file() else None


COLLIDING = ("alpha beta", "alpha:beta")  # both were alpha_beta.verdict.json


def _colliding_names(w: Path, rng: random.Random) -> Run:
    """Two hosts whose names once shared a verdict file; one fails, one passes, under -n 2 or not."""
    from pytest_dflash.config.targets import file_name

    hosts = setup(w, hosts=COLLIDING)
    for host in COLLIDING:  # the stale 'pass' where the plugin really writes the host's verdict
        (w / "reports" / f"{host}.verdict.json").unlink()
        (w / "reports" / f"{file_name(host)}.verdict.json").write_text(json.dumps({**STALE, "host": host}))
    failing = rng.choice(COLLIDING)
    run = run_pytest(w, [*hosts, *rng.choice([[], ["-n", "2"]])], FUZZ_FAIL=f"test_b[{failing}/")
    return NamedRun(run.workdir, run.args, run.env, run.returncode, run.output, named=COLLIDING)


def _check_colliding_names(run: Run) -> None:
    failing = next(host for host in COLLIDING if f"[{host}/" in run.env["FUZZ_FAIL"])
    verdicts = {host: (run.verdict(host) or {}).get("verdict") for host in COLLIDING}
    assert verdicts == {host: "fail" if host == failing else "pass" for host in COLLIDING}, verdicts
    for host in COLLIDING:
        assert f"{host}: {verdicts[host].upper()}" in run.output, run.output[-2000:]  # type: ignore[union-attr]
    summary = json.loads((run.reports / "fleet-summary.json").read_text())
    assert {h: e["verdict"] for h, e in summary["hosts"].items()} == verdicts, summary["hosts"].keys()


def _signal(signum: int, phase: str) -> Callable[[Path, random.Random], Run]:
    def act(w: Path, rng: random.Random) -> Run:
        hosts = setup(w, extra={"alpha": ["--inject", "slow-load=60"]} if phase == "readiness" else None)
        linger = {"readiness": {}, "configure": {"FUZZ_LINGER": "configure"},
                  "collection": {"FUZZ_LINGER": "collection"}, "tests": {"FUZZ_LINGER": "test"},
                  "teardown": {"FUZZ_LINGER": "teardown"}}[phase]
        when = marked(w, "test ") if phase == "readiness" else marked(w, "lingering ")
        if phase == "readiness":  # the first test's fixture waits for alpha's slow start: signal inside it
            when = _after(marked(w, "collection"), 3.0)
        return run_and_signal(w, hosts, signum=signum, when=when, **linger)
    return act


def _after(condition: Callable[[], bool], seconds: float) -> Callable[[], bool]:
    seen: list[float] = []

    def ready() -> bool:
        if not seen and condition():
            seen.append(time.monotonic())
        return bool(seen) and time.monotonic() - seen[0] >= seconds
    return ready


def _attach_discovery(signum: int) -> Callable[[Path, random.Random], Run]:
    """Killed while asking an attached server for its algorithm (pytest_configure): that host's old 'pass'
    must not stand. The server is a stdlib one that never answers /server_info."""
    def act(w: Path, rng: random.Random) -> Run:
        setup(w, hosts=())
        server = _SilentServer()
        try:
            name = f"127.0.0.1:{server.port}"
            (w / "reports" / f"{name.replace(':', '_')}.verdict.json").write_text(json.dumps({**STALE, "host": name}))
            return run_and_signal(w, ["--attach", f"http://{name}"], signum=signum, when=server.asked.is_set)
        finally:
            server.close()
    return act


class _SilentServer:
    """Accepts a request and never answers (a wedged HTTP front end)."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        asked, release = self.asked, threading.Event()
        self.release = release

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                asked.set()
                release.wait(120)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def _no_test_body(w: Path, rng: random.Random) -> Run:
    """A gate given to a run that runs no test body (issue 31): a usage error, never a green gate; from the
    command line or from PYTEST_ADDOPTS."""
    shape = rng.choice(["--co", "--collect-only", "--setup-only", "--setup-plan"])
    if rng.random() < 0.5:
        return run_pytest(w, [*setup(w), "--gate", "generation"], PYTEST_ADDOPTS=shape)
    return run_pytest(w, [*setup(w), shape, "--gate", "generation"])


def _blocked_part(w: Path, rng: random.Random) -> Run:
    """`-p no:` on a part of the plugin the verdict needs, after a passing run, one test failing."""
    hosts = setup(w)
    part = rng.choice(["dflash-verdicts", "dflash-selection", "pytest_dflash.report.started"])
    if rng.random() < 0.5:
        return run_pytest(w, [*hosts, "--gate", "generation"], PYTEST_ADDOPTS=f"-p no:{part}",
                          FUZZ_FAIL="test_b[")
    return run_pytest(w, [*hosts, "-p", f"no:{part}", "--gate", "generation"], FUZZ_FAIL="test_b[")


def _xfail_marked(w: Path, rng: random.Random) -> Run:
    """A conftest marks a failing check xfail (pytest counts it xfailed)."""
    victim = f"test_{rng.choice('bcd')}[{rng.choice(HOSTS)}"
    return run_pytest(w, [*setup(w), "--gate", "generation", *rng.choice([[], ["-n", "2"]])],
                      FUZZ_FAIL=victim, FUZZ_XFAIL=victim)


def _check_xfail_marked(run: Run) -> None:
    victim = run.env["FUZZ_FAIL"]
    host = victim.split("[", 1)[1]
    data = run.verdict(host) or {}
    assert data.get("verdict") == "fail", data.get("verdict")
    assert any(f["message"].startswith("xfail-marked: ") for f in data["failures"]), data["failures"]
    other = next(h for h in HOSTS if h != host)
    assert (run.verdict(other) or {}).get("verdict") == "pass", (run.verdict(other) or {}).get("verdict")


def _rerun(w: Path, rng: random.Random) -> Run:
    """pytest-rerunfailures: a check fails once and passes on its rerun."""
    victim = f"test_{rng.choice('abcd')}[{rng.choice(HOSTS)}"
    return run_pytest(w, [*setup(w), "--reruns", "1", "--gate", "generation", *rng.choice([[], ["-n", "2"]])],
                      FUZZ_FLAKY=victim)


def _check_rerun(run: Run) -> None:
    host = run.env["FUZZ_FLAKY"].split("[", 1)[1]
    data = run.verdict(host) or {}
    assert data.get("verdict") == "fail", data.get("verdict")
    assert [f["message"] for f in data["failures"]] == [
        "flaky: failed, then run again: Failed: FUZZ_FLAKY says this test fails once"], data["failures"]


def _outside_skip(w: Path, rng: random.Random) -> Run:
    """A conftest adds `pytest.mark.skip(reason="known flaky")` to a failing check (before: gate PASSED, exit 0)."""
    victim = f"test_{rng.choice('bcd')}[{rng.choice(HOSTS)}"
    return run_pytest(w, [*setup(w), "--gate", "generation", *rng.choice([[], ["-n", "2"]])],
                      FUZZ_FAIL=victim, FUZZ_SKIP=victim)


def _check_outside_skip(run: Run) -> None:
    host = run.env["FUZZ_SKIP"].split("[", 1)[1]
    data = run.verdict(host) or {}
    assert data.get("verdict") == "partial", data.get("verdict")
    assert [s["kind"] for s in data["skipped"]] == ["skipped from outside the profile"], data["skipped"]
    assert f"gate refused: {host}: 1 check(s) of the generation layer were skipped from outside the profile" in (
        run.output), run.output[-2000:]
    assert "known flaky" in " ".join(data["gate"]["why"]), data["gate"]
    other = next(h for h in HOSTS if h != host)
    assert (run.verdict(other) or {}).get("verdict") == "pass", (run.verdict(other) or {}).get("verdict")


def _pyargs_ignore(w: Path, rng: random.Random) -> Run:
    """The suites as a package (the wheel form), `--pyargs PKG.suites --ignore=<one suite>` whose check fails
    (before: pass, complete, nothing uncollected, exit 0; the path form gave partial)."""
    hosts = setup(w)
    suites = w / "fuzzpkg" / "suites"
    for folder in (w / "fuzzpkg", suites, suites / "a", suites / "b"):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").write_text("")
    (suites / "conftest.py").write_text(CONFTEST)
    (suites / "a" / "test_fuzz.py").write_text(SUITE)
    (suites / "b" / "test_b.py").write_text(SUITE.replace("def test_", "def test_b_"))
    ignored = rng.choice([f"--ignore={suites / 'b'}", f"--ignore-glob={suites / 'b' / '*.py'}"])
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--request-timeout=30s",
               f"--dflash-report={w / 'reports'}", "--pyargs", "fuzzpkg.suites", ignored, *hosts,
               "--gate", "generation"]
    run = Run(w, command, {"FUZZ_FAIL": "test_b_a["})
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=w,
                            env=run_env(w, FUZZ_FAIL="test_b_a["))
    run.returncode, run.output = result.returncode, result.stdout + result.stderr
    return run


def _check_pyargs_ignore(run: Run) -> None:
    for host in HOSTS:
        data = run.verdict(host) or {}
        assert data.get("complete") is False and data["tests"]["uncollected"], data.get("tests")
        assert any("never collected" in why and "the run left them out: --ignore" in why
                   for why in data["gate"]["why"]), data["gate"]["why"]


def _narrowed_gate(w: Path, rng: random.Random) -> Run:
    """A declared scope narrowed inside by an option, with --gate: refused, naming the option."""
    narrowing = rng.choice([["-k", "not test_d"], ["-m", "generation"],
                            ["--deselect", f"{w / 'suite'}/test_fuzz.py::test_c[alpha/plain]"],
                            [f"{w / 'suite'}/test_fuzz.py::test_a"]])
    run = run_pytest(w, [*setup(w), "--gate", "generation", *narrowing])
    run.env["FUZZ_NARROWING"] = narrowing[0]
    return run


def _check_narrowed_gate(run: Run) -> None:
    assert "gate generation: FAILED" in run.output, run.output[-2000:]
    assert "  gate refused: the run was narrowed: " in run.output, run.output[-2000:]
    for host in HOSTS:
        why = (run.verdict(host) or {}).get("gate", {}).get("why", [])
        assert any(w.startswith("refused: the run was narrowed: ") for w in why), why


def _tool_call(shape: str) -> Callable[[Path, random.Random], Run]:
    """The verdict's shape of a forced tool call that is never made (a failed check) or whose arguments cannot be
    validated on the controller (a 'could not check' skip), in a gated layer."""
    def act(w: Path, rng: random.Random) -> Run:
        host = rng.choice(HOSTS)
        return run_pytest(w, [*setup(w), "--gate", "generation", *rng.choice([[], ["-n", "2"]])],
                          FUZZ_TOOL=f"{shape}:[{host}/")
    return act


def _check_tool_call(run: Run) -> None:
    shape, host = run.env["FUZZ_TOOL"].split(":[", 1)
    host = host.rstrip("/")
    data = run.verdict(host) or {}
    assert data.get("gate", {}).get("passed") is False, data.get("gate")
    why = " ".join(data["gate"]["why"])
    if shape == "unforced":
        assert data["verdict"] == "fail", data["verdict"]
        assert f"failed: {host} generation: 1 check(s) failed (first: " in why and "never made" in why, why
    else:
        assert data["verdict"] == "partial", data["verdict"]
        assert "could not be made" in why and "pytest-dflash[structured]" in why, why
    other = next(h for h in HOSTS if h != host)
    assert (run.verdict(other) or {}).get("verdict") == "pass", (run.verdict(other) or {}).get("verdict")


def _unmade(w: Path, rng: random.Random) -> Run:
    """A check collection never made a test of: a python_functions override, or a conftest's
    pytest_pycollect_makeitem that returns no item for it."""
    if rng.random() < 0.5:
        return run_pytest(w, [*setup(w), "--gate", "generation", "-o", "python_functions=test_a test_b test_c"])
    return run_pytest(w, [*setup(w), "--gate", "generation"], FUZZ_UNMADE=rng.choice(["test_b", "test_d"]))


def _internal_error(w: Path, rng: random.Random) -> Run:
    """An INTERNALERROR after a passing run: a conftest's tryfirst pytest_configure (before the plugin wrote its
    start-of-run verdicts) or its pytest_collection_finish raises."""
    return run_pytest(w, [*setup(w), "--gate", "generation"], FUZZ_BOOM=rng.choice(["configure", "collection"]))


META_SUITE = '''
import pytest
from pytest_dflash.api import ServiceHandle, serves_the_profiles_algorithm, serves_the_profiles_speculation


@pytest.mark.service
def test_algorithm(dflash_service: ServiceHandle) -> None:
    serves_the_profiles_algorithm(dflash_service)


@pytest.mark.service
def test_speculation(dflash_service: ServiceHandle) -> None:
    serves_the_profiles_speculation(dflash_service)
'''


def _flaky_metadata(w: Path, rng: random.Random) -> Run:
    """Two DFLASH servers attached through proxies (kind = "external"): alpha's proxy answers /server_info
    503 a few times right after readiness (ridden out: alpha passes); beta's never routes /server_info while
    /generate works (its DFLASH checks could not be made: partial, and the service gate fails)."""
    from services.http_doubles import FaultProxy, FlakyRoute

    from pytest_dflash.refserver.launch import RefServerProcess

    hosts = setup(w)
    (w / "suite" / "test_meta.py").write_text(META_SUITE)
    rules = {"alpha": FlakyRoute(status=rng.choice([500, 502, 503]), times=rng.choice([1, 2]), after_generations=2),
             "beta": FlakyRoute(status=rng.choice([404, 405]), times=None)}
    with contextlib.ExitStack() as stack:
        for host, rule in rules.items():
            server = stack.enter_context(RefServerProcess("--speculative-algorithm", "DFLASH",
                                                          "--speculative-num-draft-tokens", "8"))
            proxy = stack.enter_context(FaultProxy(server.url, rule))
            (w / f"{host}.toml").write_text(f'[host]\nconnection = "local://"\n[services.dflash]\nkind = "external"\n'
                                            f'url = "{proxy.url}"\nalgorithm = "DFLASH"\n')
        run = run_pytest(w, [*hosts, "--gate", "service,generation"])
    run.env["FUZZ_REPLACED"] = json.dumps({host: rule.replaced for host, rule in rules.items()})
    return run


def _check_flaky_metadata(run: Run) -> None:
    alpha, beta = run.verdict("alpha"), run.verdict("beta")
    assert json.loads(run.env["FUZZ_REPLACED"])["alpha"] >= 1, "alpha's proxy never answered a 5xx"
    assert alpha is not None and alpha["verdict"] == "pass", (alpha or {}).get("partial") or run.output[-2000:]
    assert beta is not None and beta["verdict"] == "partial", (beta or {}).get("verdict")
    assert any("of the service layer could not be made" in why for why in beta["partial"]), beta["partial"]
    assert "gate service,generation: FAILED" in run.output, run.output[-2000:]
    assert "gate refused: beta: " in run.output, run.output[-2000:]


SIGNAL_NAMES = {signal.SIGINT: "sigint", signal.SIGTERM: "sigterm", signal.SIGKILL: "sigkill"}
PHASES = ("configure", "collection", "readiness", "tests", "teardown")


def _signal_shapes() -> list[Shape]:
    shapes = []
    for signum, name in SIGNAL_NAMES.items():
        killed = signum == signal.SIGKILL
        for phase in PHASES:
            shapes.append(Shape(f"{name}-{phase}", f"{name.upper()} to the main process during {phase}",
                                (-9,) if killed else (2,), "interrupted", _signal(signum, phase)))
        shapes.append(Shape(f"{name}-discovery", f"{name.upper()} while an attached server is asked for its "
                            "algorithm (pytest_configure)", (-9,) if killed else (2,), "interrupted",
                            _attach_discovery(signum)))
    return shapes


SHAPES: list[Shape] = [
    Shape("healthy", "a whole, healthy run of two hosts with --gate", (0,), "pass", _healthy),
    Shape("worker-sigkill", "-n 2, an xdist worker SIGKILLed mid-test (xdist runs the rest elsewhere)", (1,),
          "interrupted", _worker_sigkill),
    Shape("worker-sigkill-n1", "-n 1, the only xdist worker SIGKILLed mid-test (its replacement runs the rest)",
          (1,), "interrupted", _worker_sigkill_one),
    Shape("colliding-names", "hosts `alpha beta` (one test fails) and `alpha:beta`, with or without -n 2", (1,),
          "mixed", _colliding_names, _check_colliding_names),
    Shape("x", "-x, one test of one host fails", (1,), "interrupted", _x),
    Shape("maxfail", "--maxfail 1, one test fails on both hosts", (1,), "interrupted", _maxfail),
    Shape("stepwise", "--sw after a failing --sw run (stepwise deselects what passed before)", (0,), "mixed",
          _stepwise),
    Shape("last-failed", "--lf after a failing run", (0,), "partial", _last_failed),
    Shape("keyword", "-k deselects some tests", (0,), "partial", _keyword),
    Shape("conftest-drop", "a conftest drops tests silently (no pytest_deselected)", (0,), "mixed",
          _conftest_drop),
    Shape("collection-error", "a collection error under --continue-on-collection-errors, with --gate", (1,),
          "interrupted", _collection_error),
    Shape("gate-filter", "--gate with one host filtered out by -k", (1,), "mixed", _gate_filter, _check_gate_filter),
    Shape("usage-error", "a usage error (blank --gate, unknown layer, bad duration) after a passing run", (4,),
          "interrupted", _usage_error),
    Shape("shard-missing", "--fleet --shard I/2: one shard's verdicts merged alone", (0,), "mixed", _shard_missing,
          _check_shard_missing),
    Shape("no-test-body-gate", "--gate with --co, --collect-only, --setup-only or --setup-plan (also from "
          "PYTEST_ADDOPTS) after a passing run", (4,), "interrupted", _no_test_body),
    Shape("blocked-part", "`-p no:dflash-verdicts`, `dflash-selection` or `pytest_dflash.report.started` (also "
          "from PYTEST_ADDOPTS), one test failing, --gate, after a passing run", (4,), "interrupted", _blocked_part),
    Shape("xfail-marked", "a conftest marks a failing test xfail, with or without -n 2, --gate", (1,), "mixed",
          _xfail_marked, _check_xfail_marked),
    Shape("rerun", "--reruns 1 (pytest-rerunfailures): a test fails once and passes on its rerun, with or without "
          "-n 2, --gate", (1,), "mixed", _rerun, _check_rerun),
    Shape("uncollected", "-o python_functions=… or a conftest's pytest_pycollect_makeitem leaves a test "
          "uncollected, --gate", (1,), "partial", _unmade),
    Shape("outside-skip", "a conftest adds a skip marker to a failing check, with or without -n 2, --gate", (1,),
          "mixed", _outside_skip, _check_outside_skip),
    Shape("pyargs-ignore", "`--pyargs PKG.suites` with --ignore or --ignore-glob of a suite whose check fails, --gate",
          (1,), "partial", _pyargs_ignore, _check_pyargs_ignore),
    Shape("narrowed-gate", "--gate over a scope narrowed by -k, -m, --deselect or a node id", (1,), "partial",
          _narrowed_gate, _check_narrowed_gate),
    Shape("unforced-tool-call", "a forced tool call never made (a failed check of a gated layer), with or without "
          "-n 2, --gate", (1,), "mixed", _tool_call("unforced"), _check_tool_call),
    Shape("missing-validator", "a forced call's arguments cannot be validated on the controller (a 'could not "
          "check' skip of a gated layer), with or without -n 2, --gate", (1,), "mixed", _tool_call("no-validator"),
          _check_tool_call),
    Shape("internal-error", "an INTERNALERROR (a conftest's tryfirst pytest_configure or its "
          "pytest_collection_finish raises), --gate, after a passing run", (3,), "interrupted", _internal_error),
    Shape("flaky-metadata", "attached DFLASH servers: /server_info 5xx right after readiness (alpha), never routed "
          "(beta), --gate service,generation", (1,), "mixed", _flaky_metadata, _check_flaky_metadata),
    *_signal_shapes(),
]
BY_NAME = {shape.name: shape for shape in SHAPES}


def run_shape(shape: Shape, workdir: Path, seed: int) -> list[str]:
    """Run one shape in `workdir` and return the broken promises (empty: every invariant held)."""
    rng = random.Random(f"{seed}-{shape.name}")
    run = shape.act(workdir, rng)
    hosts = _named_hosts(run)
    problems = check_invariants(shape, run, hosts)
    if shape.check is not None:
        try:
            shape.check(run)
        except AssertionError as exc:
            problems.append(f"{shape.name}: {exc}")
    if shape.name in ("conftest-drop", "stepwise"):  # tests of some host were left out: that host is partial
        narrowed = [h for h in hosts if (data := run.verdict(h)) and data["verdict"] == "partial"]
        if not narrowed:
            problems.append("tests were left out and every host still passed")
    return [f"[{shape.name}, seed {seed}] {p}" for p in problems] + (
        [f"[{shape.name}] output tail:\n{run.output[-2500:]}"] if problems else [])


def _named_hosts(run: Run) -> list[str]:
    if isinstance(run, NamedRun):
        return list(run.named)
    if any(a == "--attach" for a in run.args):
        return [p.name.removesuffix(".verdict.json") for p in run.reports.glob("*.verdict.json")]
    if "--shard-merge" in run.args:
        return [h for h in HOSTS if run.verdict(h) is not None]
    return list(HOSTS)


# In every CI sample: the healthy shape (a fuzz that cannot pass proves nothing) and cheap shapes of the latest
# trust passes (issue 31; the loopholes of a blocked part, an xfail marker, a rerun, an uncollected check and an
# internal error; issue 39: a skip marker from outside, the wheel form's --ignore, a narrowed gate, and the
# verdict's shape of an unforced tool call and a missing validator), each a few seconds.
ALWAYS = ("healthy", "no-test-body-gate", "flaky-metadata", "blocked-part", "xfail-marked", "rerun", "uncollected",
          "internal-error", "outside-skip", "pyargs-ignore", "narrowed-gate", "unforced-tool-call", "missing-validator")


def sample(seed: int, count: int) -> list[Shape]:
    """The ALWAYS shapes and `count` others, chosen by the seed."""
    others = [s for s in SHAPES if s.name not in ALWAYS]
    return [*(BY_NAME[name] for name in ALWAYS), *random.Random(seed).sample(others, count)]


def docs_table() -> str:
    """The Markdown table docs/gating.md carries (every shape, its exit code and its verdict)."""
    lines = ["| run shape | exit code | every named host's verdict |", "|---|---|---|"]
    for shape in SHAPES:
        codes = ", ".join("killed (no exit code)" if c == -9 else str(c) for c in shape.exit_codes)
        verdict = {"mixed": "per host (see the fuzz's check)"}.get(shape.verdict, f"`{shape.verdict}`")
        lines.append(f"| {shape.what} (`{shape.name}`) | {codes} | {verdict} |")
    return "\n".join(lines) + "\n"
