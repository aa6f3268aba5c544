"""What a service serves (services/served.py), read from real SGLang 0.5.17's /server_info (recorded on the
H200) and from the refserver's, and compared with a command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.config.profiles import ServiceSpec
from pytest_dflash.refserver.server_args import prepare_server_args
from pytest_dflash.services.external import ExternalService
from pytest_dflash.services.ranks import tp_size_of, wedge_at_tp
from pytest_dflash.services.served import FLAGS, served_config

DATA = Path(__file__).parents[1] / "data"


def _recorded() -> dict[str, Any]:
    info: dict[str, Any] = json.loads((DATA / "sglang-0.5.17-h200" / "server_info_dflash_graph.json").read_text())
    return info


def test_the_recorded_server_info_says_every_setting() -> None:
    """Real 0.5.17 reports each setting: no parsers (None), xgrammar, one GPU; nothing is left to the command."""
    served = served_config((), _recorded())
    assert [(s.key, s.value, s.source) for s in served.settings] == [
        ("tool_call_parser", None, "/server_info"), ("reasoning_parser", None, "/server_info"),
        ("grammar_backend", "xgrammar", "/server_info"), ("tp_size", 1, "/server_info"),
        ("dp_size", 1, "/server_info"), ("pp_size", 1, "/server_info"), ("ep_size", 1, "/server_info")]
    assert served.contradictions == []
    assert served.fact() == {"tool_call_parser": None, "reasoning_parser": None, "grammar_backend": "xgrammar",
                             "tp_size": 1, "dp_size": 1, "pp_size": 1, "ep_size": 1}


def test_a_parser_reported_by_server_info_is_served_without_a_command() -> None:
    """Attached by URL to a server started with --tool-call-parser qwen25: /server_info says it (issue 39)."""
    served = served_config((), {**_recorded(), "tool_call_parser": "qwen25"})
    assert (served.tool_call_parser.value, served.tool_call_parser.source) == ("qwen25", "/server_info")
    assert served.tool_call_parser.describe() == "--tool-call-parser qwen25 (/server_info)"


def test_a_command_that_contradicts_server_info_is_named_on_each_flag() -> None:
    command = ["python", "-m", "sglang.launch_server", "--tp-size", "2", "--tool-call-parser=qwen25",
               "--grammar-backend", "xgrammar", "--ep", "1"]
    served = served_config(command, _recorded())
    assert served.contradictions == ["its command sets --tool-call-parser qwen25, /server_info says "
                                     "tool_call_parser = None",
                                     "its command sets --tp-size 2, /server_info says tp_size = 1"]
    assert [s.key for s in served.compared] == ["tool_call_parser", "grammar_backend", "tp_size", "ep_size"]
    assert served.tp_size.value == 1  # what runs
    assert tp_size_of(command, _recorded()) == 2  # ranks are looked for by the larger size: one may be stopped


def test_a_flag_the_command_leaves_out_is_no_contradiction() -> None:
    """SGLang chooses what the command leaves out (a DDTREE server turns the grammar backend off itself)."""
    served = served_config(["python", "-m", "sglang.launch_server"], {**_recorded(), "grammar_backend": "none"})
    assert served.contradictions == [] and served.compared == []
    assert served.grammar_backend.value == "none"


@pytest.mark.parametrize(("command", "info", "value", "source"), [
    (["--reasoning-parser", "qwen3"], None, "qwen3", "command"),  # no /server_info: the command says it
    (["--reasoning-parser", "{parser}"], None, None, "unknown"),  # filled in at start: not read
    ([], None, None, "unknown"),
    ([], {}, None, "unknown"),  # a /server_info without the key (not 0.5.17's)
])  # fmt: skip
def test_without_server_info_the_command_says_it_else_it_is_unknown(
        command: list[str], info: dict[str, Any] | None, value: str | None, source: str) -> None:
    setting = served_config(command, info).reasoning_parser
    assert (setting.value, setting.source) == (value, source)
    assert setting.contradiction() is None


def test_the_refserver_reports_every_setting_as_real_sglang_does() -> None:
    """The test double's /server_info (its server_args) has each key real 0.5.17 reports, with its type."""
    recorded = _recorded()
    served = prepare_server_args(["--tool-call-parser", "qwen25", "--tp-size", "1"]).as_dict()
    for key in FLAGS:
        assert key in served, key
        assert recorded[key] is None or type(served[key]) is type(recorded[key]), key
    assert served_config((), served).tool_call_parser.value == "qwen"  # renamed as SGLang renames it


@pytest.mark.parametrize(("tp", "note"), [
    ("2", ("its command sets --tp-size 2, /server_info says tp_size = 1; the engine is tensor-parallel "
           "(--tp-size 2: one stopped rank holds every collective)", [])),
    ("1", ("", [])),
])  # fmt: skip
def test_a_stuck_engine_whose_command_contradicts_server_info_says_so(tp: str, note: tuple[str, list[object]]) -> None:
    """Attached with a command saying --tp-size 2 while /server_info says 1 (issue 41): the stuck engine's note
    names the contradiction first, and the ranks are looked at by the larger size (two: one may be stopped)."""
    spec = ServiceSpec(name="dflash", kind="external", url="http://127.0.0.1:9", algorithm="DFLASH",
                       command=("python", "-m", "sglang.launch_server", "--tp-size", tp))
    assert wedge_at_tp(ExternalService(spec), None, server_info={"tp_size": 1}, gpus=(), since=None,
                       log_lines=10) == note


def test_a_deprecated_parser_name_is_the_one_sglang_serves() -> None:
    """Real SGLang 0.5.17 on an H100 (2026-12-06): `--tool-call-parser qwen25` -> /server_info
    tool_call_parser 'qwen' (ServerArgs._handle_deprecated_args). The same parser: no contradiction, and the
    forced tool calls are checked (they were "could not check" on every qwen25 service)."""
    command = ["python", "-m", "sglang.launch_server", "--tool-call-parser", "qwen25"]
    served = served_config(command, {"tool_call_parser": "qwen"})
    assert served.contradictions == [] and served.tool_call_parser.value == "qwen"
    assert served_config(command, {"tool_call_parser": "hermes"}).contradictions == [
        "its command sets --tool-call-parser qwen25, /server_info says tool_call_parser = 'hermes'"]
    # the refserver renames it as SGLang does, from the same table
    from pytest_dflash.refserver.server_args import DEPRECATED_TOOL_CALL_PARSERS as REFSERVER_TABLE
    from pytest_dflash.services.served import DEPRECATED_TOOL_CALL_PARSERS

    assert REFSERVER_TABLE == DEPRECATED_TOOL_CALL_PARSERS
    assert prepare_server_args(["--tool-call-parser", "qwen25"]).as_dict()["tool_call_parser"] == "qwen"
