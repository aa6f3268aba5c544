"""JSON Schema (draft 2020-12) of a host profile, for editors:
`pytest-dflash schema > dflash-profile.schema.json`.

The validator (`config/loader.py` and its tables in `config/tables/`) is the authority; this schema is built
from their constants (algorithms, provision modes, floor keys, perf endpoints) and the registered service
kinds' tables (config/tables/kinds.py: their names, own keys and rules), and describes every key they accept,
so an editor completes `hosts/*.toml` and flags most mistakes while typing. What a
schema cannot say — a [parity] or [floors] entry naming a service of *this* host, `{port}` only for process
services, the default `kind` depending on the connection, template files existing — stays with the validator.

Kept in sync by tests/config/test_schema.py: the keys of every table here are exactly the keys the validator
accepts (read from its own "unknown key (known: …)" answer), every shipped profile validates, and broken
profiles the validator rejects are rejected here too. Adding a key to the validator without adding it here
fails that test.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pytest_dflash.config.durations import MAX_SECONDS
from pytest_dflash.config.profiles import ALGORITHMS, AUTO
from pytest_dflash.config.tables.floors import FLOOR_KEYS, LATENCY_FLOOR
from pytest_dflash.config.tables.host import BECOME_USER, PROVISION_MODES
from pytest_dflash.config.tables.kinds import KindTable, kind_tables
from pytest_dflash.config.tables.perf import PERF_ENDPOINTS

SCHEMA_ID = "https://pytest-dflash.invalid/schemas/host-profile.schema.json"
SERVICE_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
# config/durations.py: 90, 1.5, "90s", "15m", "250ms", "2h" (spaces allowed around the number and unit)
DURATION_TEXT = r"^\s*\d+(\.\d+)?\s*(ms|s|m|h)?\s*$"
# config/tables/host.py check_connection: local://, or ssh:// (paramiko://, safe-ssh://) with a host name or a
# bracketed IPv6 address; ?timeout in (0, 5]
CONNECTION = r"^(local://.*|(ssh|paramiko|safe-ssh)://([^@/?#]+@)?([^@/?#:\[\]]+|\[[0-9A-Fa-f:.]+(%\w+)?\])(:\d+)?/?(\?.*)?)$"
# _host_name: not empty, no '/' or '\\', no control characters, no leading or trailing space
HOST_NAME = r"^(?=\S)(?=.*\S$)[^/\\\u0000-\u001f\u007f-\u009f\u2028\u2029]+$"
HTTP_URL = r"^[Hh][Tt][Tt][Pp][Ss]?://[^/?#]+"


def _any_case(word: str) -> str:
    """A regex matching `word` in any letter case (ECMA-262 regexes have no inline (?i) flag)."""
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in word)


def _algorithm(*, auto: bool) -> dict[str, Any]:
    names = (*ALGORITHMS, AUTO.lower()) if auto else ALGORITHMS
    words = (*ALGORITHMS, AUTO) if auto else ALGORITHMS
    return {
        "description": "speculative algorithm" + (" (auto: read from /server_info)" if auto else ""),
        "type": "string",
        "anyOf": [{"enum": list(names)}, {"pattern": "^(" + "|".join(_any_case(w) for w in words) + ")$"}],
    }


def _is_kind(names: list[str]) -> dict[str, Any]:
    """A JSON Schema condition: the service's `kind` is one of `names`."""
    kind = {"const": names[0]} if len(names) == 1 else {"enum": names}
    return {"required": ["kind"], "properties": {"kind": kind}}


def _service(kinds: Mapping[str, KindTable]) -> dict[str, Any]:
    """A [services.NAME] table: every kind's keys, each kind's own (unknown on the others), and its rules."""
    auto = [name for name, kind in kinds.items() if kind.auto_algorithm]
    rules: list[dict[str, Any]] = [
        {"if": _is_kind(auto),
         "else": {"required": ["algorithm"], "properties": {"algorithm": _algorithm(auto=False)}}},
    ]
    for name, kind in kinds.items():
        rule: dict[str, Any] = {"if": _is_kind([name])}
        if kind.schema:
            rule["then"] = dict(kind.schema)
        if kind.keys:
            rule["else"] = {"properties": dict.fromkeys(kind.keys, False)}
        if len(rule) > 1:
            rules.append(rule)
    return {
        "description": "one inference service of the host",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "kind": {"enum": list(kinds),
                     "description": "default: systemd for ssh:// hosts, process for local://"},
            "algorithm": _algorithm(auto=bool(auto)),
            "unit": {"type": "string", "pattern": r"^[^/]+\.service$"},
            "template": {"type": "string", "description": "unit template, relative to the profile"},
            "command": {"$ref": "#/$defs/strings"},
            "url": {"type": "string", "pattern": HTTP_URL,
                    "description": "http(s) URL; {port} and {address} are filled in"},
            "port": {"oneOf": [{"type": "integer", "minimum": 1, "maximum": 65535}, {"const": "auto"}]},
            "env": {"$ref": "#/$defs/text_map"},
            "vars": {"$ref": "#/$defs/text_map"},
            "gpus": {"$ref": "#/$defs/gpus"},
            "ready_timeout": {"$ref": "#/$defs/duration"},
            "sampled_timeout": {"$ref": "#/$defs/duration"},
            "nccl_init_timeout": {"$ref": "#/$defs/duration"},
            "api_key_env": {"type": "string"},
            "model": {"type": "string"},
            "unaccepted_draft": {"type": "string", "minLength": 1,
                                 "description": "why this speculative service's draft cannot be accepted"},
            "structured_output": {"type": "boolean", "default": True,
                                  "description": "false: serves no constrained decoding on purpose "
                                                 "(--grammar-backend none); structured checks do not apply"},
            # each kind's own keys
            **{key: value for kind in kinds.values() for key, value in kind.keys.items()},
        },
        "allOf": rules,
    }


def _defs() -> dict[str, Any]:
    count = {"type": "integer", "minimum": 1}
    positive = {"type": "number", "exclusiveMinimum": 0}
    return {
        "duration": {
            "description": "seconds, or a string like '90s', '15m', '250ms', '2h'; at most 7 days",
            "oneOf": [{"type": "number", "minimum": 0, "maximum": MAX_SECONDS},
                      {"type": "string", "pattern": DURATION_TEXT}],
        },
        "gpus": {"description": "GPU indices", "type": "array", "items": {"type": "integer", "minimum": 0}},
        "strings": {"type": "array", "items": {"type": "string"}},
        "text_map": {"type": "object", "additionalProperties": {"type": ["string", "number"]}},
        "host": {
            "description": "how to reach the host",
            "type": "object",
            "required": ["connection"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": HOST_NAME,
                         "description": "host name in reports (default: the file's stem); no '/', '\\', "
                                        "control characters"},
                "connection": {"type": "string", "pattern": CONNECTION,
                               "description": "local://, or ssh://[user@]host[:port][?timeout=N] "
                                              "(N in (0, 5])"},
                "python": {"type": "string",
                           "description": "python on the host for probes ('auto': this one)"},
                "gpus": {"$ref": "#/$defs/gpus"},
                "provision": {"enum": list(PROVISION_MODES), "default": "allowed"},
                "ssh_config": {"type": "string"},
                "ssh_identity_file": {"type": "string"},
                "cuda_home": {"type": "string"},
                "command_timeout": {"$ref": "#/$defs/duration"},
                "become": {"type": "boolean", "default": False,
                           "description": "ssh as an unprivileged user; what needs root runs through "
                                          "`sudo -n`"},
                "become_user": {"type": "string", "pattern": f"^{BECOME_USER}$", "default": "root",
                                "description": "with become = true: the user sudo runs those commands as"},
            },
        },
        "service": _service(kind_tables()),
        "parity": {
            "type": "object",
            "required": ["reference"],
            "additionalProperties": False,
            "properties": {
                "reference": {"type": "string", "description": "the service others are compared to"},
                "compare": {"$ref": "#/$defs/strings"},
                "plain": {"type": "string"},
                "tie_gap": {"type": "number"},
                "max_tie_rate": {"type": "number", "minimum": 0, "maximum": 1},
                "noise_gap": {"type": "number", "minimum": 0},
                "prompts": {"type": "string"},
            },
        },
        "floors": {
            "description": "perf-layer thresholds of one service (docs/perf.md)",
            "type": "object",
            "additionalProperties": False,
            "properties": {
                **{key: positive for key in FLOOR_KEYS if key != "speedup_vs"},
                "speedup_vs": {"type": "string", "description": "another service of this host"},
                # FLOOR_SETTINGS
                "regression_pct": {**positive, "exclusiveMaximum": 100},
                "confidence": {"type": "number", "exclusiveMinimum": 0.5, "exclusiveMaximum": 1},
                # SWEEP_FLOORS: gates on a load sweep's curve (docs/perf.md, Sweeps)
                "max_concurrency_within_slo": count,
                "goodput_at": {"type": "object", "minProperties": 1,
                               "propertyNames": {"pattern": r"^[1-9]\d*$"},
                               "additionalProperties": positive,
                               "description": "requests/s within the SLOs at a level: {16 = 5.0}"},
                "crossover_vs": {"type": "string", "description": "the plain twin of the crossover gate"},
                "speedup_up_to": count,
                "min_speedup": positive,
            },
            "patternProperties": {LATENCY_FLOOR.pattern: positive},
            "dependentRequired": {"speedup": ["speedup_vs"], "speedup_vs": ["speedup"],
                                  "crossover_vs": ["speedup_up_to"], "speedup_up_to": ["crossover_vs"],
                                  "min_speedup": ["crossover_vs"]},
        },
        "slo_objectives": {
            "type": "object",
            "additionalProperties": False,
            "patternProperties": {LATENCY_FLOOR.pattern: positive},
        },
        "slo": {
            "description": "service-level objectives every level of a load sweep is judged against; "
                         "[slo.SERVICE] overrides them for one service",
            "type": "object",
            "patternProperties": {LATENCY_FLOOR.pattern: positive},
            "additionalProperties": {"$ref": "#/$defs/slo_objectives"},
        },
        "perf_service": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"requests": count, "duration": {"$ref": "#/$defs/duration"},
                           "warmup": {"type": "integer", "minimum": 0}},
        },
        "perf": {
            "description": "how the perf layer loads the services; [perf.SERVICE] overrides "
                           "requests/duration/warmup",
            "type": "object",
            "properties": {
                "endpoint": {"enum": list(PERF_ENDPOINTS)},
                "concurrency": count,
                "requests": count,
                "duration": {"$ref": "#/$defs/duration"},
                "warmup": {"type": "integer", "minimum": 0},
                "prompt_len": count,
                "output_len": count,
                "temperature": {"type": "number", "minimum": 0},
                "seed": {"type": "integer", "minimum": 0},
                "request_timeout": {"$ref": "#/$defs/duration"},
                "max_loop_lag_ms": positive,
                "max_client_cpu": positive,
                "retries": {"type": "integer", "minimum": 0},
                "client_procs": count,
                "sweep": {"type": "array", "minItems": 1, "items": count,
                          "description": "concurrency levels of a load sweep (closed loop, no rates)"},
                "sweep_requests": count,
                "sweep_budget": {"$ref": "#/$defs/duration"},
                "dataset": {"type": "string",
                            "description": "prompts the load sends instead of synthetic words: a JSONL or "
                                           "ShareGPT file (relative to the profile), or \"builtin\" (the "
                                           "shipped set)"},
            },
            "additionalProperties": {"$ref": "#/$defs/perf_service"},
        },
    }


def profile_schema() -> dict[str, Any]:
    """The JSON Schema of a host profile (a parsed TOML document)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "pytest-dflash host profile",
        "description": "hosts/NAME.toml: how to reach a host and which DFlash / DDTree services it serves "
                       "(docs/profiles.md)",
        "type": "object",
        "required": ["host", "services"],
        "additionalProperties": False,
        "properties": {
            "host": {"$ref": "#/$defs/host"},
            "services": {
                "type": "object",
                "minProperties": 1,
                "propertyNames": {"pattern": SERVICE_NAME},
                "additionalProperties": {"$ref": "#/$defs/service"},
            },
            "parity": {"$ref": "#/$defs/parity"},
            "floors": {"type": "object", "additionalProperties": {"$ref": "#/$defs/floors"}},
            "perf": {"$ref": "#/$defs/perf"},
            "slo": {"$ref": "#/$defs/slo"},
        },
        "$defs": _defs(),
    }


def schema_text() -> str:
    return json.dumps(profile_schema(), indent=2) + "\n"
