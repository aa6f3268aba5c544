"""Discovery of an attached server's algorithm: bounded, interruptible, and never printing a URL's password."""

from __future__ import annotations

import signal
import socket
import time
from types import FrameType

import pytest

from pytest_dflash.config.loader import attach_profile
from pytest_dflash.run import discovery

PASSWORD = "s3cret-pw"


def _refused_url() -> str:
    with socket.socket() as sock:  # bound and closed: nothing listens there, connections are refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://user:{PASSWORD}@127.0.0.1:{port}"


def test_an_interrupt_ends_the_wait_for_a_server_not_up_yet_at_once() -> None:
    """Ctrl-C / SIGTERM (a KeyboardInterrupt in the main thread) while a server refuses connections: discover()
    returns control within a retry, not after WAIT_UP_S (the threads asking must not be joined to the end)."""
    profile = attach_profile(_refused_url())

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            discovery.discover({profile.name: profile}, wait_up_s=120.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - started < 5.0


def test_a_server_that_never_comes_up_is_an_answer_with_a_masked_url(capsys: pytest.CaptureFixture[str]) -> None:
    """The wait budget spent: the answer is an error (its service test fails with it) and neither the printed
    line nor the reason kept in the profile carries the password."""
    profile = attach_profile(_refused_url())
    answers = discovery.discover({profile.name: profile}, wait_up_s=0.5)
    (answer,) = answers.values()
    assert answer.get("cause") == "refused"
    applied = discovery.apply({profile.name: profile}, answers)[profile.name]
    (spec,) = applied.services.values()
    assert spec.discovery_error and "could not be read" in spec.discovery_error
    assert PASSWORD not in spec.discovery_error
    err = capsys.readouterr().err
    assert "could not be read" in err and PASSWORD not in err


@pytest.mark.parametrize(("status", "times", "algorithm"), [(503, 2, "DFLASH"), (405, None, "NONE")],
                         ids=["503-twice", "405-always"])
def test_a_transient_5xx_is_asked_again_and_only_not_served_means_plain(status: int, times: int | None,
                                                                        algorithm: str) -> None:
    """/server_info 503 twice, then the answer: the algorithm is read (not an error, not 'plain'); 405 on
    both paths: a server that is not SGLang, treated as plain."""
    from services.http_doubles import FaultProxy, FlakyRoute

    from pytest_dflash.refserver.launch import RefServerProcess

    rule = FlakyRoute(status=status, times=times)
    with RefServerProcess("--speculative-algorithm", "DFLASH") as server, FaultProxy(server.url, rule) as proxy:
        (spec,) = attach_profile(proxy.url).services.values()
        answer = discovery.ask(spec)
    assert answer.get("algorithm") == algorithm, answer
    assert rule.replaced == 2  # 503: twice, then through; 405: each of the two names once, not retried


def test_discovery_asks_both_names_within_one_deadline() -> None:
    """/server_info answers 404 late, /get_server_info is accepted and never answered: the answer (an error) comes
    within the one discovery deadline, not one per name."""
    from services.http_doubles import StallServer

    limit_s = 2.0
    with StallServer({"/server_info": (404, 0.8 * limit_s)}) as server:
        (spec,) = attach_profile(server.url).services.values()
        started = time.monotonic()
        answer = discovery.ask(spec, timeout_s=limit_s)
        took = time.monotonic() - started
        asked = list(server.requests)
    assert asked[:2] == ["/server_info", "/get_server_info"], asked
    assert "error" in answer and answer.get("cause") == "timeout", answer
    assert took < 1.5 * limit_s, f"{took:.1f}s for a {limit_s:g}s deadline"


def test_a_501_on_server_info_is_an_error_naming_it_never_plain() -> None:
    """A proxy answering 501 for /server_info in front of a DFLASH server: the algorithm is unknown (an error that
    names HTTP 501: the service-layer test fails with it), never "not SGLang: plain", which would leave every
    speculative test of the service unselected and the host passing."""
    from services.http_doubles import FaultProxy, FlakyRoute

    from pytest_dflash.refserver.launch import RefServerProcess

    rule = FlakyRoute(status=501, times=None)
    with RefServerProcess("--speculative-algorithm", "DFLASH") as server, FaultProxy(server.url, rule) as proxy:
        (spec,) = attach_profile(proxy.url).services.values()
        answer = discovery.ask(spec, timeout_s=2.0)
    assert "algorithm" not in answer, answer
    assert "HTTP 501" in answer["error"] and "/server_info" in answer["error"], answer


@pytest.mark.parametrize(("body", "said"), [
    (b"[" * 20_000, "JSON nested too deep"),
    (b"<html>maintenance</html>", "Expecting value"),
], ids=["nested-too-deep", "not-json"])
def test_a_server_info_that_is_not_json_is_an_error_naming_it(body: bytes, said: str) -> None:
    """/server_info answered 200 with garbage, or JSON nested deeper than the parser follows (a RecursionError
    before, which `ask` did not catch): an answer naming the path and what was wrong."""
    from services.http_doubles import FaultProxy, Reply

    with FaultProxy("http://127.0.0.1:9", lambda method, path, payload: Reply(200, body)) as proxy:
        (spec,) = attach_profile(proxy.url).services.values()
        answer = discovery.ask(spec, timeout_s=2.0)
    assert "algorithm" not in answer, answer
    assert answer["error"].startswith("GET /server_info: malformed JSON body") and said in answer["error"], answer


def test_attaching_a_server_whose_server_info_is_nested_too_deep_is_one_line(pytester: pytest.Pytester) -> None:
    """A real pytest run with --attach: the discovery line names the URL and "nested too deep"; no
    INTERNALERROR."""
    from services.http_doubles import FaultProxy, Reply
    from support.pytest_runs import assert_no_crash

    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    with FaultProxy("http://127.0.0.1:9", lambda method, path, payload: Reply(200, b"[" * 20_000)) as proxy:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "--attach", proxy.url,
                                               timeout=120)
    assert_no_crash(result)
    lines = [line for line in result.stderr.lines if "could not be read" in line]
    assert len(lines) == 1 and proxy.url in lines[0] and "JSON nested too deep" in lines[0], result.stderr.str()
