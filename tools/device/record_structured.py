#!/usr/bin/env python3
"""ON THE GPU MACHINE: record what real SGLang answers to constrained requests (issue 33 item 6).

    PYTHONPATH=/tmp/site python3 tools/device/record_structured.py OUT_DIR [--only plain,dflash,...]

Starts each server of tools/device/h200-structured.toml in turn (same flags, one at a time, its own port),
waits for /health_generate, sends the cases below and writes OUT_DIR/<service>.json: every request body, the
HTTP status and the answer verbatim, and the server log's lines that mention grammar / xgrammar / tool /
abort. Then stops the server (SIGTERM, SIGKILL after 20 s). Stdlib only. Every wait has a deadline.

The recordings become tests/data/sglang-0.5.17-h200-structured/ with self-tests that validate each answer with
pytest_dflash.layers.generation.structured (docs/real-sglang.md, "Structured output").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

TARGET = "/tmp/models/target"
BASE = [
    "--model-path",
    TARGET,
    "--host",
    "127.0.0.1",
    "--attention-backend",
    "triton",
    "--mem-fraction-static",
    "0.3",
    "--disable-cuda-graph",
]
SERVICES: dict[str, list[str]] = {
    "plain": ["--tool-call-parser", "qwen25"],
    "dflash": [
        "--tool-call-parser",
        "qwen25",
        "--speculative-algorithm",
        "DFLASH",
        "--speculative-draft-model-path",
        "/tmp/models/draft",
    ],
    "ngram": [
        "--tool-call-parser",
        "qwen25",
        "--speculative-algorithm",
        "NGRAM",
        "--speculative-num-draft-tokens",
        "8",
    ],
    "nogrammar": ["--grammar-backend", "none"],
    "nows": ["--tool-call-parser", "qwen25", "--constrained-json-disable-any-whitespace"],
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "maximum": 999}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
GREEDY = {"temperature": 0, "max_new_tokens": 160}
SAMPLED = {"temperature": 0.8, "max_new_tokens": 160, "sampling_seed": 11}


def cases() -> list[tuple[str, str, dict[str, Any]]]:
    """(name, path, body) of every recorded request."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    grammars = {
        "json_schema": json.dumps(PERSON),
        "regex": r"[a-z]{3}-[0-9]{2}",
        "ebnf": 'root ::= answer "."\nanswer ::= "yes" | "no" | "maybe"',
    }
    for kind, value in grammars.items():
        for mode, params in (("greedy", GREEDY), ("sampled", SAMPLED)):
            for stream in (False, True):
                body = {
                    "text": "The quick brown fox",
                    "sampling_params": {**params, kind: value},
                    "stream": stream,
                }
                out.append((f"generate-{kind}-{mode}{'-stream' if stream else ''}", "/generate", body))
    chat = {"messages": [{"role": "user", "content": "Who are you?"}], "temperature": 0, "max_tokens": 160}
    out.append(
        (
            "chat-json_schema",
            "/v1/chat/completions",
            {
                **chat,
                "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
            },
        )
    )
    out.append(
        ("chat-json_object", "/v1/chat/completions", {**chat, "response_format": {"type": "json_object"}})
    )
    out.append(
        ("chat-tool-required", "/v1/chat/completions", {**chat, "tools": TOOLS, "tool_choice": "required"})
    )
    out.append(
        (
            "chat-tool-named",
            "/v1/chat/completions",
            {**chat, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "add"}}},
        )
    )
    out.append(
        (
            "generate-bad-schema",
            "/generate",
            {"text": "Hi", "sampling_params": {**GREEDY, "json_schema": '{"type": 12}'}},
        )
    )
    out.append(
        ("generate-bad-regex", "/generate", {"text": "Hi", "sampling_params": {**GREEDY, "regex": "("}})
    )
    return out


def post(port: int, path: str, body: dict[str, Any], timeout_s: float = 300) -> tuple[int, str]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        return -1, f"{type(exc).__name__}: {exc}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(proc: subprocess.Popen[bytes], port: int, deadline_s: float) -> bool:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health_generate", timeout=10) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, TimeoutError, OSError):
            pass
        time.sleep(2)
    return False


def record(name: str, args: list[str], out: Path) -> None:
    port = free_port()
    log = out / f"{name}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglang.launch_server", *BASE, "--port", str(port), *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    started = time.monotonic()
    result: dict[str, Any] = {"service": name, "args": args, "answers": []}
    try:
        result["ready"] = wait_ready(proc, port, 480)
        result["ready_s"] = round(time.monotonic() - started, 1)
        if result["ready"]:
            for case, path, body in cases():
                t0 = time.monotonic()
                status, text = post(port, path, body)  # 300 s: the first sampled one JIT-compiles ~100 s
                result["answers"].append(
                    {
                        "case": case,
                        "path": path,
                        "body": body,
                        "status": status,
                        "seconds": round(time.monotonic() - t0, 2),
                        "answer": text[:200_000],
                    }
                )
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        result["exit"] = proc.poll()
        lines = log.read_text("utf-8", "replace").splitlines()
        result["log_lines"] = [
            line for line in lines if re.search(r"grammar|xgrammar|tool|abort|Traceback|Error", line, re.I)
        ][:200]
        (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    answers = len(result["answers"])
    print(f"[structured] {name}: ready={result.get('ready')} answers={answers} exit={result['exit']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", default=",".join(SERVICES))
    ns = parser.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    for name in ns.only.split(","):
        record(name, SERVICES[name], ns.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
