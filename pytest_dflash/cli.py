"""`pytest-dflash` console script.

    pytest-dflash --version
    pytest-dflash check HOST|PATH|DIR|INVENTORY[:GROUP]|URL... [--hosts-dir DIR] [--json]
    pytest-dflash schema
    pytest-dflash merge DIR|FILE... --out DIR [--previous SUMMARY.json | --no-previous] [--history DIR]
                        [--prometheus FILE] [--prometheus-push URL] [--gate LAYERS] [--exclude HOST]...
                        [--latest] [--expect-hosts N] [--perf-threshold PCT] [--quiet]

check validates host profiles and fleet inventories exactly as `pytest --host / --fleet / --attach` does, with
the same one-line errors, and prints what each host resolves to; exit 0 when all are valid, 4 (pytest's usage
error) when any is not. schema prints the JSON Schema of a host profile (config/schema.py).

merge reads per-host verdict JSONs (files, or folders searched recursively: one folder per CI shard is fine),
and writes into --out: fleet-summary.json, fleet-summary.html, fleet-junit.xml and fleet.prom; it keeps every
passing host's verdict as history/<host>/last-good.verdict.json (for "what changed" on the next failure).

Exit codes:
    0  summary written; every host passed (with a gate: the gated layers passed on every host, in runs that
       were whole: none interrupted, no shard's own gate refused, every shard exited 0 or 1)
    1  summary written; some host failed, was interrupted or only partially tested (with a gate: a gated layer
       did not pass somewhere, or a shard's run cannot be trusted), or fewer hosts than --expect-hosts
    2  bad input, nothing written: usage error, missing path, a file that is not a verdict, conflicting
       duplicate verdicts of one host, an unreadable --previous, shards that ran different gates
    3  the outputs could not be written (I/O error), or the --prometheus-push failed (the files were written)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_dflash import __version__
from pytest_dflash.config import inventory
from pytest_dflash.config.durations import format_seconds
from pytest_dflash.config.layers import LAYERS
from pytest_dflash.config.loader import attach_profile, error_line, load_profile, resolve_profile_path
from pytest_dflash.config.profiles import HostProfile
from pytest_dflash.config.schema import schema_text
from pytest_dflash.errors import InventoryError
from pytest_dflash.fleet import outputs as fleet_outputs
from pytest_dflash.fleet import prometheus
from pytest_dflash.fleet import summary as fleet_summary
from pytest_dflash.fleet import verdicts as fleet_verdicts
from pytest_dflash.services import registry  # noqa: F401 - the service kinds: check and schema read their tables

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_OUTPUT = 0, 1, 2, 3
EXIT_USAGE = 4  # check: a bad profile or inventory, as pytest exits on one


def _layers(raw: str) -> list[str]:
    layers = [part.strip() for part in raw.split(",") if part.strip()]
    unknown = [layer for layer in layers if layer not in LAYERS]
    if unknown or not layers:
        raise argparse.ArgumentTypeError(f"unknown layer {unknown[0]!r} (layers: {', '.join(LAYERS)})"
                                         if unknown else "no layer given")
    return layers


def _percent(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{raw!r} must not be negative")
    return value


def _count(raw: str) -> int:
    if not raw.isdigit():
        raise argparse.ArgumentTypeError(f"{raw!r} is not a non-negative integer")
    return int(raw)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="pytest-dflash",
                                  description="pytest-dflash: host profile and fleet tools")
    top.add_argument("--version", action="version", version=f"pytest-dflash {__version__}")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = commands.add_parser(
        "check", help="validate host profiles and fleet inventories; print what each host resolves to",
        description="Validate host profiles and inventories as pytest --host / --fleet / --attach would, "
                    "with the same one-line errors, and print what each host resolves to. Each argument is a "
                    "profile name (looked up in --hosts-dir, then the built-in ones) or .toml path (--host), "
                    "a folder of profiles or an Ansible inventory FILE[:GROUP] (--fleet), or an http(s) URL "
                    "(--attach). Exit 0: all valid; 4: some input is not.")
    check.add_argument("targets", nargs="+", metavar="HOST|PATH|DIR|INVENTORY[:GROUP]|URL",
                       help="what to check (as --host, --fleet or --attach takes it)")
    check.add_argument("--hosts-dir", type=Path, default=Path("hosts"), metavar="DIR",
                       help="where profile names are looked up (default: ./hosts), as pytest's --hosts-dir")
    check.add_argument("--json", action="store_true", help="print the resolved hosts as one JSON object")
    commands.add_parser("schema", help="print the JSON Schema (draft 2020-12) of a host profile, for editors",
                        description="Print the JSON Schema (draft 2020-12) of a host profile "
                                    "(hosts/*.toml), e.g. for taplo / Even Better TOML (docs/profiles.md).")
    merge = commands.add_parser(
        "merge",
        help="merge per-shard verdict JSONs into one fleet summary (HTML + JSON + JUnit + Prometheus)",
        description="Merge per-host verdict JSONs (files or folders, e.g. one per CI shard) into one fleet "
                    "summary. Exit 0: every host passed (or the gate passed); 1: some host failed (or the "
                    "gate did not pass, or fewer hosts than --expect-hosts); 2: bad input, nothing written; "
                    "3: the outputs could not be written.")
    merge.add_argument("inputs", nargs="+", metavar="DIR|FILE", help="verdict files or folders of them")
    merge.add_argument("--out", required=True, type=Path, metavar="DIR", help="folder for the summary files")
    merge.add_argument("--previous", type=Path, metavar="SUMMARY.json",
                       help="the previous run's fleet-summary.json, for the trend (default: the one in "
                            "--out, if any)")
    merge.add_argument("--no-previous", action="store_true", help="no trend, even if --out has a summary")
    merge.add_argument("--history", type=Path, metavar="DIR",
                       help="per-host last good verdicts (default: --out/history)")
    merge.add_argument("--prometheus", type=Path, metavar="FILE",
                       help="also write the Prometheus textfile here (atomic), e.g. into node_exporter's "
                            "textfile-collector folder")
    merge.add_argument("--prometheus-push", metavar="URL",
                       help="also push the metrics to this Prometheus Pushgateway (PUT, 10 s timeout): "
                            "http://HOST:9091 (job pytest-dflash) or "
                            "http://HOST:9091/metrics/job/NAME[/LABEL/VALUE]...; exit 3 if the push fails")
    merge.add_argument("--gate", type=_layers, metavar="LAYERS",
                       help="exit 0 only if these layers passed on every host (default: the --gate the runs "
                            "used, as recorded in their verdicts)")
    merge.add_argument("--exclude", action="append", default=[], metavar="HOST",
                       help="leave this host (a glob) out of the summary and the gate; repeatable")
    merge.add_argument("--latest", action="store_true",
                       help="when two different verdicts name one host, keep the one that finished last "
                            "(default: an error)")
    merge.add_argument("--expect-hosts", type=_count, metavar="N",
                       help="exit 1 if fewer than N hosts have a verdict (a shard that never reported)")
    merge.add_argument("--perf-threshold", type=_percent, default=5.0, metavar="PCT",
                       help="perf changes smaller than this are not listed in the trend (default 5)")
    merge.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")
    return top


def merge(args: argparse.Namespace) -> int:
    out: Path = args.out
    if args.prometheus_push:
        try:
            prometheus.check_push_url(args.prometheus_push)
        except prometheus.PushError as exc:
            return _error(f"--prometheus-push {exc}")
    if out.exists() and not out.is_dir():
        return _error(f"--out {out}: exists and is not a folder")
    previous: Path | None = None
    if not args.no_previous:
        if args.previous is not None:
            if not args.previous.is_file():
                return _error(f"--previous {args.previous}: no such file")
            previous = args.previous
        elif (out / fleet_outputs.SUMMARY_JSON).is_file():
            previous = out / fleet_outputs.SUMMARY_JSON
    try:
        verdicts, excluded = fleet_verdicts.load_verdicts(args.inputs, latest=args.latest,
                                                          exclude=args.exclude)
        if not verdicts:
            return _error("every verdict was excluded: nothing to summarise")
        if previous is not None:
            fleet_summary.read_summary(previous)  # validate before writing anything
        gate = args.gate or fleet_summary.gate_layers_of(verdicts)
    except fleet_verdicts.FleetInputError as exc:
        return _error(str(exc))
    try:
        summary, outputs = fleet_outputs.summarize(
            verdicts, out, previous_path=previous, history_dir=args.history or out / fleet_verdicts.HISTORY,
            gate_layers=gate, excluded=excluded, exclude_patterns=args.exclude, prometheus=args.prometheus,
            perf_threshold_pct=args.perf_threshold)
    except OSError as exc:
        print(f"pytest-dflash merge: error: cannot write the summary: {exc}", file=sys.stderr)
        return EXIT_OUTPUT
    except fleet_verdicts.FleetInputError as exc:
        return _error(str(exc))
    status = EXIT_OK
    if summary["gate"] is not None:
        status = EXIT_OK if summary["gate"]["passed"] else EXIT_FAILED
    elif summary["totals"]["pass"] < summary["totals"]["hosts"]:
        status = EXIT_FAILED  # failed, interrupted or partial hosts: not every host passed
    missing = None
    if args.expect_hosts is not None and summary["totals"]["hosts"] < args.expect_hosts:
        missing = f"expected {args.expect_hosts} hosts, got verdicts for {summary['totals']['hosts']}"
        status = EXIT_FAILED
    if not args.quiet:
        inputs = f"{len(verdicts)} verdicts from {len(summary['runs'])} run(s)"
        print(f"pytest-dflash merge: {inputs} -> {out}")
        for line in fleet_outputs.headline(summary):
            print(f"  {line}")
        if missing:
            print(f"  {missing}")
        for path in outputs.all():
            print(f"  wrote {path}")
    elif missing:
        print(f"pytest-dflash merge: {missing}", file=sys.stderr)
    if args.prometheus_push:
        try:
            pushed = prometheus.push(args.prometheus_push, summary)
        except prometheus.PushError as exc:
            print(f"pytest-dflash merge: error: --prometheus-push {exc}", file=sys.stderr)
            return EXIT_OUTPUT
        if not args.quiet:
            print(f"  pushed to {pushed}")
    return status


def check(args: argparse.Namespace) -> int:
    """Resolve every target as load_targets (config/targets.py) does; print each host or each error."""
    hosts_dir: Path = args.hosts_dir.expanduser().resolve()
    profiles: dict[str, HostProfile] = {}
    errors: list[str] = []
    kinds = [(_target_kind(spec), spec) for spec in args.targets]
    # The plugin's order: --host, then --attach, then --fleet (a fleet host whose name is taken is an error).
    for wanted in ("host", "attach", "fleet"):
        for kind, spec in kinds:
            if kind != wanted:
                continue
            try:
                if kind == "host":
                    found = [load_profile(resolve_profile_path(spec, [hosts_dir]))]
                elif kind == "attach":
                    found = [attach_profile(spec)]
                else:
                    found = inventory.load_fleet(spec, hosts_dir)
                    for profile in found:
                        if profile.name in profiles:
                            raise InventoryError(spec, profile.name,
                                                 "this host name is already used by another profile")
            except InventoryError as exc:
                errors.append(error_line(exc))
                continue
            profiles.update((profile.name, profile) for profile in found)
    if args.json:
        print(json.dumps({"hosts": {name: describe(p) for name, p in profiles.items()}, "errors": errors,
                          "not_contacted": [name for name, p in profiles.items()
                                            if str(p.source) == ATTACH_SOURCE]},
                         indent=2))
    else:
        attached = 0
        for profile in profiles.values():
            for line in _describe_lines(describe(profile)):
                print(line)
            if str(profile.source) == ATTACH_SOURCE:
                attached += 1
                print(f"  not contacted: {NOT_CONTACTED}")
        for message in errors:
            print(f"pytest-dflash check: error: {message}", file=sys.stderr)
        print(f"{len(profiles)} host(s) valid" + (f", {len(errors)} error(s)" if errors else "")
              + (f" ({attached} URL(s) checked as written, not contacted)" if attached else ""))
    return EXIT_USAGE if errors else EXIT_OK


ATTACH_SOURCE = "--attach"  # the source of a profile made from a URL (config/loader.py attach_profile)
NOT_CONTACTED = ("check reads the URL, it sends nothing to it; whether the server answers, and the algorithm "
                 "it serves, are seen when `pytest --attach URL` runs")


def _target_kind(spec: str) -> str:
    """host, attach or fleet: which pytest option would take this argument."""
    if spec.startswith(("http://", "https://")):
        return "attach"
    path_text = spec if Path(spec).exists() or ":" not in spec else spec.rpartition(":")[0]
    path = Path(path_text).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix != ".toml"):
        return "fleet"
    return "host"


def describe(profile: HostProfile) -> dict[str, Any]:
    """What a validated profile resolves to, as plain data (URL passwords masked: it is printed)."""
    services = {
        name: {"kind": spec.kind, "algorithm": spec.algorithm, "url": spec.display_url,
               **({"unit": spec.unit} if spec.unit else {}),
               **({"gpus": list(spec.gpus)} if spec.gpus else {}),
               **({"model": spec.model} if spec.model else {}),
               "ready_timeout": format_seconds(spec.ready_timeout_s)}
        for name, spec in profile.services.items()}
    parity = None
    if profile.parity is not None:
        parity = {"reference": profile.parity.reference, "compare": list(profile.parity.compare)}
    perf = {k: format_seconds(v) if k in ("duration", "request_timeout") else v
            for k, v in profile.perf.items() if k != "services"}
    return {"name": profile.name, "source": str(profile.source), "connection": profile.display_connection,
            "python": profile.python, "gpus": list(profile.gpus), "provision": profile.provision,
            "services": services, "parity": parity,
            "perf": perf or None,
            "floors": {name: dict(values) for name, values in profile.floors.items()} or None}


def _describe_lines(info: dict[str, Any]) -> list[str]:
    connection = info["connection"] or "no host access (attached by URL)"
    lines = [f"{info['name']}: {connection} (provision {info['provision']}; python {info['python']}"
             + (f"; gpus {','.join(map(str, info['gpus']))}" if info["gpus"] else "")
             + f") <- {info['source']}"]
    for service, spec in info["services"].items():
        extra = "".join(f", {key} {spec[key]}" for key in ("unit", "model") if key in spec)
        gpus = f", gpus {','.join(map(str, spec['gpus']))}" if "gpus" in spec else ""
        lines.append(f"  {service}: {spec['kind']} {spec['algorithm']} {spec['url']}{extra}{gpus}")
    if info["parity"]:
        lines.append(f"  parity: {info['parity']['reference']} vs "
                     f"{', '.join(info['parity']['compare']) or '-'}")
    if info["perf"]:
        lines.append("  perf: " + ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                            for k, v in info["perf"].items()))
    for service, floors in (info["floors"] or {}).items():
        lines.append(f"  floors.{service}: " + ", ".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in floors.items()))
    return lines


def _error(message: str) -> int:
    print(f"pytest-dflash merge: error: {message}", file=sys.stderr)
    return EXIT_INPUT


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _run(parser().parse_args(argv))
    except BrokenPipeError:  # `pytest-dflash check … | head`: the reader left; that is not an error
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - stays open until exit, so the final flush succeeds
        return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    if args.command == "merge":
        return merge(args)
    if args.command == "check":
        return check(args)
    if args.command == "schema":
        sys.stdout.write(schema_text())
        return EXIT_OK
    return EXIT_INPUT  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
