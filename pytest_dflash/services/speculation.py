"""The speculation a server really serves, against what its profile asked for.

SGLang quietly changes speculative settings at start-up and says so only in its log (the warnings below are
SGLang 0.5.17's own strings, `sglang/srt/arg_groups/speculative_hook.py`,
`speculative/draft_worker_common.py`, `speculative/dflash_worker_v2.py`): it resets `max_running_requests` to
48, forces `num_steps` / `topk` to 1 for DFLASH, derives or adjusts the number of draft tokens, falls back to
another draft attention backend, and on builds without the sampling kernel verifies sampled requests by greedy
argmax. Three sources are compared:

* requested: the speculative flags of the profile's command (`requested_speculation`);
* served: `/server_info` (`served_speculation`, recorded as the service's fact "speculation" in the verdict);
* said: SGLang's warnings in the service's log (`log_findings`).

`compare` (with the profile's `[perf]` concurrency) sorts the differences into failures (the served
speculation is not the one asked for: algorithm, number of draft tokens / block size, greedy-verification
fallback) and notes (everything else).

SGLang 0.5.20+ also says how it was started: `/server_info` `launch_command`, the launcher's arguments joined
by spaces (`server_args._launch_command = " ".join(argv)` with `argv = sys.argv[1:]`, 0.5.20
`sglang/srt/server_args.py:736`; 0.5.23 masks only `--watermark-config`, `server_args.py:717`, so an
`--api-key` in it is in clear). `launch_argv` reads it back; without a command in the profile (attached by
URL, a unit attached without a template) it is what was requested; with one, `launch_drift` compares the two
(a speculative flag that differs: the unit is stale or was edited, a failure; any other flag: a note), and
`shown_launch_command` is the fact the verdict records (secrets masked, length capped).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_dflash.scrub.bounds import KB, scrub
from pytest_dflash.scrub.redact import MASK, redact_argv

# /server_info key -> the flags that ask for it (the first one is named in messages)
FLAGS: dict[str, tuple[str, ...]] = {
    "speculative_algorithm": ("--speculative-algorithm",),
    "speculative_num_draft_tokens": ("--speculative-num-draft-tokens", "--speculative-dflash-block-size"),
    "speculative_num_steps": ("--speculative-num-steps",),
    "speculative_eagle_topk": ("--speculative-eagle-topk",),
    "speculative_draft_attention_backend": ("--speculative-draft-attention-backend",),
    "attention_backend": ("--attention-backend",),
    "max_running_requests": ("--max-running-requests",),
    "context_length": ("--context-length",),
    "disable_overlap_schedule": ("--disable-overlap-schedule",),  # a switch
}
SWITCHES = ("disable_overlap_schedule",)
INTEGERS = ("speculative_num_draft_tokens", "speculative_num_steps", "speculative_eagle_topk",
            "max_running_requests", "context_length")
# A difference in these is a failure: the server speculates differently from what was asked.
BINDING = ("speculative_algorithm", "speculative_num_draft_tokens")
# topk 1: num_draft_tokens := num_steps + 1 (SGLang's rule)
TOPK_ONE_ADJUSTS = ("EAGLE", "EAGLE3", "STANDALONE")
# The speculation itself: the launch command and the profile's command must agree on these (launch_drift).
SPECULATIVE = ("speculative_algorithm", "speculative_num_draft_tokens", "speculative_num_steps",
               "speculative_eagle_topk")
LAUNCH_COMMAND_BYTES = 2 * KB  # the launch command as a fact of the verdict: SGLang's own has no limit
SERVED_KEYS = (*FLAGS, "speculative_draft_model_path", "speculative_ddtree_budget",
               "speculative_dflash_block_size", "speculative_use_rejection_sampling", "disaggregation_mode")


@dataclass(frozen=True)
class LogRule:
    """One SGLang warning about a speculative setting it changed or could not honour."""

    name: str
    pattern: re.Pattern[str]
    fails: bool  # the served speculation is not what was asked (else: a note)
    meaning: str


LOG_RULES: tuple[LogRule, ...] = (
    LogRule("greedy_fallback", re.compile(r"falling back to greedy argmax verification"), True,
            "sampled requests are verified by greedy argmax: their outputs are not drawn from the target's "
            "distribution (a build without the sampling kernel)"),
    LogRule("max_running_requests_reset",
            re.compile(r"Max running requests is reset to (\d+) for speculative decoding"), False,
            "max_running_requests was reset for speculative decoding (set --max-running-requests to choose "
            "it)"),
    LogRule("num_steps_forced",
            re.compile(r"only supports speculative_num_steps == 1; overriding speculative_num_steps="),
            False, "speculative_num_steps was forced to 1"),
    LogRule("topk_forced",
            re.compile(r"only supports speculative_eagle_topk == 1; overriding speculative_eagle_topk="),
            False, "speculative_eagle_topk was forced to 1"),
    LogRule("draft_attention_backend_fallback",
            re.compile(r"draft worker only supports attention_backend in [^\n]*Falling back to"), False,
            "the draft attention backend asked for is not supported: another one serves the draft"),
    LogRule("num_draft_tokens_adjusted",
            re.compile(r"speculative_num_draft_tokens is adjusted to speculative_num_steps \+ 1"), False,
            "speculative_num_draft_tokens was adjusted to num_steps + 1 (topk 1)"),
    LogRule("num_draft_tokens_defaulted",
            re.compile(r"(?:defaulting speculative_num_draft_tokens to \d+|speculative_num_draft_tokens is "
                       r"not set; defaulting to \d+|speculative_num_draft_tokens is set to \d+ by default)"),
            False, "the number of draft tokens was not given: the server chose it"),
    LogRule("spec_v2_synchronous", re.compile(r"Non-overlap \(synchronous\) spec v2 is used"), False,
            "speculation runs without the overlap scheduler"),
)


@dataclass
class Findings:
    """What differs between requested, served and said."""

    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def requested_speculation(command: Sequence[str]) -> dict[str, Any]:
    """The speculative settings a command line asks for, keyed like /server_info (only those it names)."""
    out: dict[str, Any] = {}
    args = list(command)
    for index, arg in enumerate(args):
        flag, has_value, inline = arg.partition("=")
        for key, flags in FLAGS.items():
            if flag not in flags:
                continue
            if key in SWITCHES:
                out[key] = True
                continue
            value = inline if has_value else (args[index + 1] if index + 1 < len(args) else None)
            if value is None or value.startswith("--"):
                continue
            out[key] = _normalise(key, value)
    return out


def _normalise(key: str, value: Any) -> Any:
    if key in INTEGERS:
        try:
            return int(value)
        except (TypeError, ValueError):
            return value
    if key == "speculative_algorithm":
        return str(value).upper()
    return value


def served_speculation(server_info: Mapping[str, Any] | None) -> dict[str, Any]:
    """The speculative configuration /server_info reports (empty without one); a fact of the verdict."""
    info = server_info or {}
    algorithm = str(info.get("speculative_algorithm") or "NONE").upper()
    if algorithm == "NONE":
        return {}
    return {key: _normalise(key, info[key]) for key in SERVED_KEYS
            if info.get(key) is not None and not (key == "disaggregation_mode" and info[key] == "null")}


_SERVER_ARGS_VALUE = r"=('(?:[^'\\]|\\.)*'|None|True|False|-?\d+(?:\.\d+)?)"


def server_args_from_log(log: str) -> dict[str, Any]:
    """The speculative keys of the log's first ``server_args=ServerArgs(...)`` line, as /server_info has them
    (empty where the log has no such line or no speculation): what was served, for a server whose /server_info
    is gone."""
    line = next((text for text in log.splitlines() if "server_args=ServerArgs(" in text), None)
    if line is None:
        return {}
    out: dict[str, Any] = {}
    for key in SERVED_KEYS:
        match = re.search(rf"[(\s]{key}{_SERVER_ARGS_VALUE}", line)
        if match is None:
            continue
        raw = match.group(1)
        value: Any = {"None": None, "True": True, "False": False}.get(raw, raw)
        if isinstance(value, str) and value.startswith("'"):
            value = value[1:-1]
        out[key] = value
    return served_speculation(out)


def log_findings(log: str) -> list[tuple[LogRule, str]]:
    """Each rule whose warning is in `log`, with its first line."""
    found = []
    for rule in LOG_RULES:
        match = rule.pattern.search(log)
        if match:
            start = log.rfind("\n", 0, match.start()) + 1
            end = log.find("\n", match.end())
            found.append((rule, log[start : end if end != -1 else len(log)].strip()))
    return found


def compare(requested: Mapping[str, Any], served: Mapping[str, Any], log: str = "", *,
            algorithm: str | None = None, perf_concurrency: int | None = None) -> Findings:
    """Failures and notes: the profile's `algorithm` and command (`requested`) vs /server_info (`served`) vs
    the log; `perf_concurrency` ([perf] concurrency) above the served max_running_requests is a note (requests
    queue)."""
    findings = Findings()
    running = served.get("max_running_requests")
    if perf_concurrency is not None and isinstance(running, int) and perf_concurrency > running:
        findings.notes.append(f"[perf] concurrency {perf_concurrency} > the served max_running_requests "
                              f"{running}: "
                              "the perf layer's requests queue on the server")
    asked = dict(requested)
    if algorithm is not None and algorithm not in ("AUTO",):
        asked.setdefault("speculative_algorithm", algorithm)
    if served.get("disaggregation_mode"):
        findings.notes.append(f"served under prefill/decode disaggregation (disaggregation_mode = "
                              f"{served['disaggregation_mode']!r}): speculation has been reported silently "
                              "off there upstream; the accept length is the proof that it runs")
    said = log_findings(log)
    adjusted = any(rule.name == "num_draft_tokens_adjusted" for rule, _ in said)
    served_algorithm = str(served.get("speculative_algorithm") or "NONE").upper()
    for key, want in asked.items():
        if key == "speculative_algorithm":
            got: Any = served_algorithm
        elif key not in served:
            continue
        else:
            got = served[key]
        if got == want:
            continue
        flag = FLAGS[key][0]
        message = f"{flag}{'' if key in SWITCHES else f' {want}'} asked, /server_info {key} = {got!r}"
        topk_one = (key == "speculative_num_draft_tokens" and served_algorithm in TOPK_ONE_ADJUSTS
                    and (adjusted or served.get("speculative_eagle_topk") == 1))
        if key in BINDING and not topk_one:
            findings.failures.append(message)
        else:
            findings.notes.append(message + (" (topk 1: SGLang uses num_steps + 1)" if topk_one else ""))
    for rule, line in said:
        value = rule.pattern.search(line)
        # a note that names its value needs no log line (it was printed on every DFLASH host, in full)
        text = (f"{rule.meaning}; served {value.group(1)}" if not rule.fails and value and value.groups()
                else f"{rule.meaning}; the log says: {line}")
        (findings.failures if rule.fails else findings.notes).append(text)
    return findings


def launch_argv(server_info: Mapping[str, Any] | None) -> list[str] | None:
    """/server_info `launch_command` (SGLang 0.5.20+) split back into its arguments; None where the server
    does not say it (older releases; an `Engine` built in-process says `None`). SGLang joins them with
    spaces and no quoting, so a value holding a space comes back as two arguments."""
    raw = (server_info or {}).get("launch_command")
    if not isinstance(raw, str) or not raw.strip():
        return None
    return raw.split()


def shown_launch_command(server_info: Mapping[str, Any] | None) -> str | None:
    """The launch command as the verdict records it: secret flag values masked (`--api-key`, any `*-key`,
    `*-token`, `*-secret`, `*-password`), URL passwords masked, cut to LAUNCH_COMMAND_BYTES."""
    argv = launch_argv(server_info)
    if argv is None:
        return None
    return scrub(" ".join(redact_argv(argv)), LAUNCH_COMMAND_BYTES, "launch command")


def command_flags(command: Sequence[str]) -> dict[str, str | None]:
    """`--flag` -> its value (the arguments up to the next `--flag`, joined by spaces; None for a switch), as
    argparse reads a command line: what comes before the first flag (the program) is left out, and a flag
    given twice keeps its last value."""
    out: dict[str, str | None] = {}
    flag: str | None = None
    for arg in command:
        if arg.startswith("--"):
            name, has_value, inline = arg.partition("=")
            flag = None if has_value else name
            out[name] = inline if has_value else None
        elif flag is not None:
            out[flag] = arg if out[flag] is None else f"{out[flag]} {arg}"
    return out


def _placeholder(value: Any) -> bool:
    return isinstance(value, str) and "{" in value  # {port}, {model}: filled in at start, not comparable


def _secret(value: Any) -> bool:
    """A masked secret, or a reference to one ($API_KEY): not a setting to compare."""
    return isinstance(value, str) and (MASK in value or value.startswith("$"))


def _with(flag: str, value: Any) -> str:
    """'with --flag 8', 'with --switch', 'without --flag' (False: not given; None or True: a switch)."""
    if value is False:
        return f"without {flag}"
    return f"with {flag}" if value is None or value is True else f"with {flag} {value}"


def _flag_of(key: str, command: Sequence[str]) -> str:
    """The flag `command` sets `key` with (`--speculative-dflash-block-size` or another of FLAGS[key]); the
    first of FLAGS[key] where it sets none."""
    given = {arg.partition("=")[0] for arg in command}
    return next((flag for flag in FLAGS[key] if flag in given), FLAGS[key][0])


def _has(flag: str, value: Any) -> str:
    return f"no {flag}" if value is False else _with(flag, value).removeprefix("with ")


def launch_drift(profile_command: Sequence[str], launch: Sequence[str]) -> Findings:
    """The profile's command against the running server's launch command: a speculative setting (algorithm,
    number of draft tokens / block size, steps, topk) they disagree on is a failure (the server was started
    from another command: a stale or edited unit); any other flag that differs is a note. Values holding a
    {placeholder} are not compared, nor secrets (masked, or a $reference: never shown)."""
    findings = Findings()
    asked, started = requested_speculation(profile_command), requested_speculation(launch)
    for key in SPECULATIVE:
        want, got = asked.get(key, False), started.get(key, False)
        if want == got or _placeholder(want):
            continue
        findings.failures.append(
            f"the running server was started {_with(_flag_of(key, launch), got)}; "
            + ("the profile's command has " if want is False else "the profile asks for ")
            + f"{_has(_flag_of(key, profile_command), want)} (it was not started from the profile's command: "
            "a stale or edited unit, or a server started by hand)")
    speculative = {flag for key in SPECULATIVE for flag in FLAGS[key]}
    mine, theirs = command_flags(redact_argv(profile_command)), command_flags(redact_argv(launch))
    for flag in sorted((set(mine) | set(theirs)) - speculative):
        want, got = mine.get(flag, False), theirs.get(flag, False)
        if want == got or _placeholder(want) or _secret(want) or _secret(got):
            continue
        findings.notes.append(f"the running server was started {_with(flag, got)}; the profile's command has "
                              f"{_has(flag, want)}")
    return findings


__all__ = [
    "FLAGS",
    "LAUNCH_COMMAND_BYTES",
    "LOG_RULES",
    "SPECULATIVE",
    "Findings",
    "LogRule",
    "command_flags",
    "compare",
    "launch_argv",
    "launch_drift",
    "log_findings",
    "requested_speculation",
    "served_speculation",
    "server_args_from_log",
    "shown_launch_command",
]
