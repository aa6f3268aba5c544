"""Evidence caps: every text is cut to its limit, says what was cut and why, and is redacted before the cut;
the `dflash` property, failure texts, skip reasons and verdict messages stay within theirs."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from pytest_dflash.errors import ServiceNotReady
from pytest_dflash.evidence.attach import bounded_info, first_line
from pytest_dflash.report.session import _message
from pytest_dflash.report.verdict import VerdictBuilder
from pytest_dflash.run.blocking import Failure, blocked_message, blocked_reason, is_blocked
from pytest_dflash.scrub.bounds import (
    ITEM_BYTES,
    LINE_BYTES,
    LONGREPR_BYTES,
    MAX_ENTRIES,
    PROPERTY_BYTES,
    bound_obj,
    cap,
    failure_text,
    human,
    nbytes,
    scrub,
)
from pytest_dflash.scrub.redact import MASK

MARKER = re.compile(r"\[… ([\d,]+) bytes cut: cap ([\d.]+ [KM]?B) per ([a-z ]+)\]")
RECORDED_LOG = Path(__file__).parents[1] / "data" / "sglang-0.5.17-h200" / "logs" / "server_dflash_graph.log"


def cut_of(text: str) -> tuple[int, str, str]:
    match = MARKER.search(text)
    assert match, text[:300]
    return int(match.group(1).replace(",", "")), match.group(2), match.group(3)


def test_text_under_the_limit_is_returned_as_is() -> None:
    text = "x" * 100
    assert cap(text, 100, "item") is text
    assert cap("é" * 50, 100, "item") == "é" * 50  # 100 bytes exactly


@pytest.mark.parametrize("keep", ["head", "tail", "both"])
@pytest.mark.parametrize("limit", [256, 1024, ITEM_BYTES, LONGREPR_BYTES])
def test_a_long_text_fits_its_limit_and_says_exactly_what_was_cut(keep: str, limit: int) -> None:
    text = "".join(f"line {i:06d} " + "ab" * 30 + "\n" for i in range(40_000))  # ~2.9 MB
    out = cap(text, limit, "report section", keep=keep)  # type: ignore[arg-type]
    assert nbytes(out) <= limit
    cut, stated_cap, what = cut_of(out)
    assert stated_cap == human(limit) and what == "report section"
    kept = out.replace(MARKER.search(out).group(0), "")  # type: ignore[union-attr]
    assert cut == nbytes(text) - nbytes(kept.replace("\n", "", 2 if keep == "both" else 1))
    if keep in ("head", "both"):
        assert out.startswith("line 000000 ")
    if keep in ("tail", "both"):
        assert out.endswith("line 039999 " + "ab" * 30 + "\n")
    if keep == "tail":
        assert out.split("\n")[1].startswith("line ")  # the tail starts at a whole line


def test_multibyte_text_is_cut_at_character_boundaries() -> None:
    text = "日本語のログ" * 10_000
    out = cap(text, 1000, "log tail", keep="both")
    assert nbytes(out) <= 1000
    assert out.encode("utf-8").decode("utf-8") == out
    assert set(MARKER.sub("", out).replace(" ", "")) <= set("日本語のログ")


def test_human_sizes() -> None:
    assert [human(300), human(1024), human(8192), human(1536), human(3 * 1024 * 1024)] == [
        "300 B", "1 KB", "8 KB", "1.5 KB", "3 MB"]


def test_scrub_redacts_before_it_cuts_so_a_cut_cannot_separate_a_secret_from_its_name() -> None:
    secret = "sk-live-0123456789abcdefghij"
    # the 1 KB cut falls between "--api-key" and the value: cut first, the value would survive unmarked
    text = "a" * 400 + " --api-key " + "zzzzzzzz" + secret + " " + "b" * 5000
    out = scrub(text, 1024, "report section")
    assert secret not in out and "zzzzzzzz" not in out
    assert nbytes(out) <= 1024


def test_scrub_is_fast_and_safe_on_megabytes() -> None:
    key = "SuperSecretValue123"
    text = (f"PASSWORD={key} " + "word " * 1_000_000 + f" --api-key {key} " + "x=1 " * 200_000
            + f" AWS_SECRET_ACCESS_KEY={key}")
    started = time.monotonic()
    out = scrub(text, ITEM_BYTES, "report section")
    assert time.monotonic() - started < 2.0
    assert key not in out and MASK in out and nbytes(out) <= ITEM_BYTES


def test_a_real_log_is_cut_to_its_tail_with_the_last_lines_whole() -> None:
    log = RECORDED_LOG.read_text()
    assert nbytes(log) > 4 * ITEM_BYTES
    out = scrub(log, ITEM_BYTES, "log tail", keep="tail")
    assert nbytes(out) <= ITEM_BYTES
    assert out.endswith(log.rstrip("\n")[-200:]) or out.endswith(log[-200:])
    assert out.startswith("[… ") and "per log tail]" in out.splitlines()[0]
    assert log.splitlines()[-1] in out


def test_bound_obj_caps_strings_and_lists_and_masks_secret_keys() -> None:
    value = {"notes": ["n" * 50_000] + [f"note {i}" for i in range(500)],
             "facts": {"env": {"AWS_SECRET_ACCESS_KEY": "abc", "HF_TOKEN": "hf_x", "max_prefill_tokens": 16384,
                               "api_key": None, "log": "--api-key k3yk3yk3y and more"}}}
    out = bound_obj(value, item=1024, what="verdict entry")
    assert nbytes(out["notes"][0]) <= 1024 and "per verdict entry]" in out["notes"][0]
    assert len(out["notes"]) == MAX_ENTRIES + 1 and "401 more entries cut" in out["notes"][-1]
    env = out["facts"]["env"]
    assert env["AWS_SECRET_ACCESS_KEY"] == MASK and env["HF_TOKEN"] == MASK
    assert env["max_prefill_tokens"] == 16384 and env["api_key"] is None  # settings and absences stay
    assert "k3yk3yk3y" not in env["log"]


def info(**extra: object) -> dict[str, object]:
    base: dict[str, object] = {"host": "h", "profile": "p.toml", "connection": "local://", "layer": "generation",
                               "services": ["dflash"], "blocked": False, "diagnosis": [], "service_facts": {},
                               "notes": [], "metrics": {}, "facts": {}}
    return {**base, **extra}


def test_the_dflash_property_is_bounded_and_says_what_was_cut() -> None:
    huge = info(notes=["note " + "x" * 20_000 for _ in range(20)],
                facts={f"fact{i}": "y" * 9_000 for i in range(50)},
                service_facts={"dflash": {"server_info": "z" * 3_000_000, "accept_length": 3.2}},
                diagnosis=[{"id": "D1", "title": "t", "evidence": "e" * 1_000_000}])
    out = bounded_info(huge)
    size = len(json.dumps(out).encode())
    assert size <= PROPERTY_BYTES, size
    assert any("cut" in note for note in out["notes"])
    # the verdict builder still folds it (types kept)
    builder = VerdictBuilder("run")
    builder.add("t::x", "call", "failed", out, "m")
    assert builder.hosts["h"].verdict == "fail"
    assert builder.hosts["h"].services["dflash"].get("accept_length", 3.2) == 3.2


def test_a_small_property_is_unchanged() -> None:
    small = info(notes=["first sampled request took 84 s"], facts={"env": {"torch": "2.11.0"}},
                 service_facts={"dflash": {"accept_length": 3.2, "max_prefill_tokens": 16384}})
    assert bounded_info(small) == small


def test_a_failure_text_from_a_huge_error_and_log_fits_a_failure_text() -> None:
    tail = "\n".join(f"[2026-11-30 10:00:{i % 60:02d}] " + "q" * 30_000 for i in range(100))
    exc = ServiceNotReady("h/dflash", 900, "HTTP 500: " + "r" * 2_000_000 + " api_key='s3cr3tkey'", tail)
    text = failure_text(exc)
    assert nbytes(text) <= LONGREPR_BYTES - 512
    assert "s3cr3tkey" not in text
    assert "per error message]" in text and "per log tail]" in text
    assert text.startswith("service h/dflash not ready after 900s: HTTP 500: rrr")


def test_blocked_reasons_are_one_redacted_line() -> None:
    failure = Failure("h", "service", "dflash", "suites/service/test_x.py::test_ready[h/dflash]",
                      "not ready: " + "w" * 100_000 + " --api-key blockedsecret")
    reason = blocked_reason(failure)
    assert is_blocked(reason) and nbytes(reason) <= LINE_BYTES
    assert reason.startswith("blocked: service layer failed on h/dflash (suites/service/test_x.py::")
    assert "per skip reason]" in reason
    message = blocked_message("h/dflash is not usable: HF_TOKEN=hf_abcdefghijklmnopqrstuvwx")
    assert "hf_abc" not in message and message.startswith("blocked: h/dflash is not usable: HF_TOKEN=")


def test_first_line_is_capped_and_redacted() -> None:
    text = "def test():\n>       assert False\nE       AssertionError: body=" + "b" * 100_000 + " password=pw0rd\n"
    line = first_line(text)
    assert nbytes(line) <= LINE_BYTES and "pw0rd" not in line and line.startswith("AssertionError: body=bbb")


def test_verdict_messages_are_capped_and_redacted() -> None:
    failed = pytest.TestReport("t.py::test_x", ("t.py", 1, "test_x"), {}, "failed",
                               "E   AssertionError: " + "m" * 500_000 + " Authorization: Bearer abcdefghijklmnop",
                               "call")
    message = _message(failed)
    assert nbytes(message) <= LINE_BYTES and "abcdefghijklmnop" not in message and "bytes cut: cap 1 KB per" in message
    skipped = pytest.TestReport("t.py::test_y", ("t.py", 1, "test_y"), {}, "skipped",
                                ("t.py", 1, "Skipped: blocked: " + "s" * 10_000 + " DB_PASSWORD=hunter22"), "setup")
    message = _message(skipped)
    assert nbytes(message) <= LINE_BYTES and message.startswith("blocked: sss")


def test_first_line_of_a_plain_text_failure_is_its_exception_and_message() -> None:
    """The plugin's concise failure text: the exception and its message first, evidence and where after it."""
    text = ("AssertionError: [curand-header-missing] no curand headers\n    remedy: install them\n"
            "(raised at suites/env/test_env.py:103, in test_toolkit_has_curand_headers[local])")
    assert first_line(text, text) == "AssertionError: [curand-header-missing] no curand headers"
    assert first_line("[gw0] linux -- Python 3.11\n" + text, text).startswith("AssertionError: [curand")
