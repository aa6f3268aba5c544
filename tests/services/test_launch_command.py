"""/server_info `launch_command` (SGLang 0.5.20+) in the served-speculation comparison, on real text: the
commands of every profile that started a server on the H200, turned into the launch command SGLang 0.5.20+
serves for them exactly as it builds it (`server_args._launch_command = " ".join(argv)`, `argv` =
`sys.argv[1:]`: 0.5.20 `sglang/srt/server_args.py:736`, `sglang/launch_server.py:22`), and the server_args
those servers logged."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.scrub.redact import MASK
from pytest_dflash.services.speculation import (
    LAUNCH_COMMAND_BYTES,
    command_flags,
    compare,
    launch_argv,
    launch_drift,
    requested_speculation,
    server_args_from_log,
    shown_launch_command,
)

DATA = Path(__file__).parents[1] / "data"
TOOLS = Path(__file__).parents[2] / "tools" / "device"
PROFILES = sorted([*TOOLS.glob("*.toml"), *DATA.glob("sglang-0.5.17-h200*/**/*.toml")])


def launch_command(command: list[str], port: int = 31000) -> str:
    """What a 0.5.20+ /server_info says for a server a profile started with `command` (`{python} -m
    sglang.launch_server ARGS`): ARGS, as started (placeholders filled), joined by spaces."""
    assert command[1:3] == ["-m", "sglang.launch_server"], command
    return " ".join(arg.replace("{port}", str(port)) for arg in command[3:])


def real_commands() -> list[tuple[str, list[str]]]:
    found = []
    for profile in PROFILES:
        for name, table in tomllib.loads(profile.read_text()).get("services", {}).items():
            if table.get("command"):
                found.append((f"{profile.relative_to(DATA.parent.parent)}:{name}", list(table["command"])))
    return found


def test_a_server_started_from_its_profile_shows_no_drift() -> None:
    """No false alarm on the ~90 real commands the H200 runs started servers with: same flags, and {port}
    (filled in at start) is not compared."""
    commands = real_commands()
    assert len(commands) >= 80
    for where, command in commands:
        launch = launch_argv({"launch_command": launch_command(command)})
        assert launch is not None
        drift = launch_drift(command, launch)
        assert drift.failures == [] and drift.notes == [], where
        assert requested_speculation(launch) == requested_speculation(command), where


def test_older_releases_and_an_in_process_engine_have_no_launch_command() -> None:
    recorded = json.loads((DATA / "sglang-0.5.17-h200" / "server_info_dflash_graph.json").read_text())
    assert "launch_command" not in recorded and launch_argv(recorded) is None  # real 0.5.17
    assert launch_argv({**recorded, "launch_command": None}) is None  # ServerArgs built directly: None
    assert shown_launch_command(recorded) is None


def test_attached_without_a_command_the_launch_command_is_what_was_asked() -> None:
    """The DFLASH server of DDTree run 4 (recorded): started asking 16 draft tokens it served. Attached by URL
    the profile has no command; the launch command alone lets compare() judge it: served as asked, and a
    launch command asking 8 fails as the profile's command asking 8 always did."""
    run = DATA / "sglang-0.5.17-h200-ddtree" / "run4-accept"
    log = (run / "server_dflash_acc.log").read_text()
    served = server_args_from_log(log)
    table = next(t for p in run.glob("*.toml")
                 for n, t in tomllib.loads(p.read_text())["services"].items() if n == "dflash_acc")
    launch = launch_argv({"launch_command": launch_command(table["command"])})
    assert launch is not None
    asked = requested_speculation(launch)
    assert compare(asked, served, log, algorithm="DFLASH").failures == []
    edited = launch_argv({"launch_command": launch_command(
        [*table["command"], "--speculative-num-draft-tokens", "8"])})
    assert edited is not None
    assert compare(requested_speculation(edited), served, log, algorithm="DFLASH").failures == [
        "--speculative-num-draft-tokens 8 asked, /server_info speculative_num_draft_tokens = 16"]


def _dflash_command() -> list[str]:
    table = tomllib.loads((TOOLS / "h200.toml").read_text())["services"]["dflash"]
    command: list[str] = table["command"]
    return command


@pytest.mark.parametrize(("started_with", "failure"), [
    (["--speculative-num-draft-tokens", "8"],
     "the running server was started with --speculative-num-draft-tokens 8; the profile's command has no "
     "--speculative-num-draft-tokens"),
    (["--speculative-num-steps", "3", "--speculative-eagle-topk", "4"],
     "the running server was started with --speculative-num-steps 3; the profile's command has no "
     "--speculative-num-steps"),
])
def test_a_speculative_flag_the_running_server_was_started_with_and_the_profile_lacks_fails(
        started_with: list[str], failure: str) -> None:
    """tools/device/h200.toml's DFLASH service, but the unit on the host was edited (or is stale): the speculative
    flags disagree, which the served values alone would not show (SGLang forces steps and topk to 1 for DFLASH)."""
    command = _dflash_command()
    launch = launch_argv({"launch_command": launch_command([*command, *started_with])})
    assert launch is not None
    drift = launch_drift(command, launch)
    assert drift.failures[0].startswith(failure)
    assert drift.failures[0].endswith("(it was not started from the profile's command: a stale or edited unit, "
                                      "or a server started by hand)")
    assert drift.notes == []


def test_the_profile_asking_other_speculation_names_both_values_and_other_flags_are_notes() -> None:
    command = [*_dflash_command(), "--speculative-dflash-block-size", "16", "--api-key", "profile-key-1234"]
    started = launch_command([*_dflash_command(), "--speculative-num-draft-tokens", "8", "--api-key",
                              "server-key-5678"]).replace("--mem-fraction-static 0.3", "--mem-fraction-static 0.5")
    launch = launch_argv({"launch_command": started.replace("--disable-cuda-graph ", "")})
    assert launch is not None
    drift = launch_drift(command, launch)
    assert [f.split(" (it was")[0] for f in drift.failures] == [
        "the running server was started with --speculative-num-draft-tokens 8; the profile asks for "
        "--speculative-dflash-block-size 16"]
    assert drift.notes == [  # secrets are not compared: a different key is no note, and is never shown
        "the running server was started without --disable-cuda-graph; the profile's command has "
        "--disable-cuda-graph",
        "the running server was started with --mem-fraction-static 0.5; the profile's command has "
        "--mem-fraction-static 0.3"]


def test_the_recorded_launch_command_masks_secrets_and_is_capped() -> None:
    command = [*_dflash_command(), "--api-key", "sk-server-0123456789abcdef", "--admin-api-key", "adm-1234",
               "--ssl-keyfile-password", "pem-pass-1", "--tokenizer-path", "/tmp/models/target"]
    shown = shown_launch_command({"launch_command": launch_command(command)})
    assert shown is not None
    assert shown == launch_command(command).replace("sk-server-0123456789abcdef", MASK).replace(
        "adm-1234", MASK).replace("pem-pass-1", MASK)
    huge = shown_launch_command({"launch_command": launch_command(command) + " --lora-paths" + " /a" * 5000})
    assert huge is not None and len(huge.encode()) <= LAUNCH_COMMAND_BYTES and "bytes cut" in huge
    assert MASK in huge and "sk-server" not in huge


def test_command_flags_reads_as_argparse_does() -> None:
    flags: dict[str, Any] = command_flags(["python3", "-m", "sglang.launch_server", "--model-path", "/m",
                                           "--cuda-graph-bs", "1", "2", "4", "--enable-metrics", "--port=30000",
                                           "--port", "30001"])
    assert flags == {"--model-path": "/m", "--cuda-graph-bs": "1 2 4", "--enable-metrics": None,
                     "--port": "30001"}
