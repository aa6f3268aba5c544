"""What a service serves beyond its speculation: its parsers, grammar backend and parallel sizes, each with
where it was read (`ServedConfig`, `served_config`).

SGLang 0.5.17's `/server_info` holds every ServerArgs field (recorded: tests/data/sglang-0.5.17-h200/
server_info_dflash_graph.json): `tool_call_parser`, `reasoning_parser` (None where none is set),
`grammar_backend` (resolved: "xgrammar" by default, "none" where it is off, a DDTREE server sets it itself),
`tp_size`, `dp_size`, `pp_size`, `ep_size`. That is what runs, so it is what a check judges: an attached
server started with `--tool-call-parser qwen25` gets its forced tool calls checked without a command in the
profile. Where /server_info does not say it (not SGLang, or it could not be read), the profile's command says
it; where neither does, it is unknown.

With both, the command is compared with /server_info on every flag the command names (an absent flag is
SGLang's default, which SGLang may change itself: a DDTREE server turns the grammar backend off, a gpt-oss
model picks its own parsers): a value they disagree on is a contradiction, named by the service layer
(`test_serves_the_commands_configuration`): the server is not the one the profile describes (a stale unit, a
server started by hand, a proxy in front of another one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pytest_dflash.config.profiles import ServiceSpec

__all__ = ["DEPRECATED_TOOL_CALL_PARSERS", "FLAGS", "Served", "ServedConfig", "as_served", "command_of",
           "served_config"]

Source = Literal["/server_info", "command", "unknown"]

# /server_info key -> the flags that set it (SGLang 0.5.17 server_args.py; the first is named in messages;
# argparse also takes the unambiguous prefixes `--tp`, `--dp`, `--pp`, `--ep` listed here)
FLAGS: dict[str, tuple[str, ...]] = {
    "tool_call_parser": ("--tool-call-parser",),
    "reasoning_parser": ("--reasoning-parser",),
    "grammar_backend": ("--grammar-backend",),
    "tp_size": ("--tp-size", "--tensor-parallel-size", "--tp"),
    "dp_size": ("--dp-size", "--data-parallel-size", "--dp"),
    "pp_size": ("--pp-size", "--pipeline-parallel-size", "--pp"),
    "ep_size": ("--ep-size", "--expert-parallel-size", "--ep"),
}
SIZES = ("tp_size", "dp_size", "pp_size", "ep_size")
# SGLang 0.5.17 renames these before anything reads them (ServerArgs._handle_deprecated_args, with a
# warning), so /server_info says `qwen` for `--tool-call-parser qwen25`: the same parser, no contradiction
# (seen on a real H100, 2026-12-06: the comparison failed every qwen25 service before it knew this)
DEPRECATED_TOOL_CALL_PARSERS = {"qwen25": "qwen", "glm45": "glm"}


@dataclass(frozen=True)
class Served:
    """One setting as the service serves it: its value, where that was read, and what the command says.

    `value` None is "none set" where the source is /server_info (no parser) or the command, and "not known"
    where the source is "unknown" (neither says it)."""

    key: str
    value: str | int | None
    source: Source
    command: str | int | None = None  # the command's value, where it names the flag

    @property
    def flag(self) -> str:
        return FLAGS[self.key][0]

    @property
    def known(self) -> bool:
        return self.source != "unknown"

    def describe(self) -> str:
        """'--tool-call-parser qwen25 (command)', 'no --tool-call-parser (/server_info)', or unknown."""
        if not self.known:
            return f"{self.flag}: unknown (neither /server_info nor the command says it)"
        shown = f"{self.flag} {self.value}" if self.value is not None else f"no {self.flag}"
        return f"{shown} ({self.source})"

    def contradiction(self) -> str | None:
        """Where the command names the flag and /server_info says otherwise: the sentence that says so."""
        if self.source != "/server_info" or self.command is None:
            return None
        if as_served(self.key, self.command) == self.value:
            return None
        return f"its command sets {self.flag} {self.command}, /server_info says {self.key} = {self.value!r}"


@dataclass(frozen=True)
class ServedConfig:
    """What a service serves: parsers, grammar backend and parallel sizes (`ServiceHandle.served`)."""

    tool_call_parser: Served
    reasoning_parser: Served
    grammar_backend: Served
    tp_size: Served
    dp_size: Served
    pp_size: Served
    ep_size: Served

    @property
    def settings(self) -> tuple[Served, ...]:
        return (self.tool_call_parser, self.reasoning_parser, self.grammar_backend, self.tp_size,
                self.dp_size, self.pp_size, self.ep_size)

    @property
    def contradictions(self) -> list[str]:
        """Each setting the command and /server_info disagree on, as a sentence."""
        return [said for setting in self.settings if (said := setting.contradiction()) is not None]

    @property
    def compared(self) -> list[Served]:
        """The settings the command names and /server_info says: those compared."""
        return [s for s in self.settings if s.source == "/server_info" and s.command is not None]

    def fact(self) -> dict[str, Any] | None:
        """What the verdict records (`services.<name>.served`): each setting /server_info says; None where it
        says none of them."""
        said = {s.key: s.value for s in self.settings if s.source == "/server_info"}
        return said or None


def command_of(spec: ServiceSpec) -> tuple[str, ...]:
    """The server command the profile gives a service: its `command`, with a container's `args` after it."""
    extra = spec.container.args if spec.container is not None else ()
    return (*spec.command, *extra)


def as_served(key: str, value: str | int | None) -> str | int | None:
    """A command's value as SGLang serves it (a deprecated parser name under its new name)."""
    if key == "tool_call_parser" and isinstance(value, str):
        return DEPRECATED_TOOL_CALL_PARSERS.get(value, value)
    return value


def _normalise(key: str, value: Any) -> str | int | None:
    if value is None:
        return None
    if key in SIZES:
        try:
            return int(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def _command_values(command: Sequence[str]) -> dict[str, str | int | None]:
    """The settings `command` names (`--flag X` or `--flag=X`; the last one given wins, as argparse reads
    it). A value holding a {placeholder} is filled in at start: it is not read."""
    out: dict[str, str | int | None] = {}
    args = list(command)
    for index, arg in enumerate(args):
        flag, has_value, inline = arg.partition("=")
        key = next((k for k, flags in FLAGS.items() if flag in flags), None)
        if key is None:
            continue
        raw = inline if has_value else (args[index + 1] if index + 1 < len(args) else None)
        if raw is None or raw.startswith("--") or "{" in raw:
            continue
        out[key] = _normalise(key, raw)
    return out


def served_config(command: Sequence[str], server_info: Mapping[str, Any] | None) -> ServedConfig:
    """Each setting from /server_info where it says it, else from `command`, else unknown; with the command's
    value beside it for the comparison."""
    asked = _command_values(command)
    info = server_info or {}
    settings: dict[str, Served] = {}
    for key in FLAGS:
        if key in info:
            settings[key] = Served(key, _normalise(key, info[key]), "/server_info", asked.get(key))
        elif key in asked:
            settings[key] = Served(key, asked[key], "command", asked[key])
        else:
            settings[key] = Served(key, None, "unknown")
    return ServedConfig(**settings)
