"""`pytest-dflash` console script.

    pytest-dflash merge DIR|FILE... --out DIR [--previous SUMMARY.json | --no-previous] [--history DIR]
                        [--prometheus FILE] [--gate LAYERS] [--exclude HOST]... [--latest] [--expect-hosts N]
                        [--perf-threshold PCT] [--quiet]

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
    3  the outputs could not be written (I/O error)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_dflash.fleet import summary as fleet_summary
from pytest_dflash.run.layers import LAYERS

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_OUTPUT = 0, 1, 2, 3


def _layers(raw: str) -> list[str]:
    layers = [part.strip() for part in raw.split(",") if part.strip()]
    unknown = [layer for layer in layers if layer not in LAYERS]
    if unknown or not layers:
        raise argparse.ArgumentTypeError(f"unknown layer {unknown[0]!r} (layers: {', '.join(LAYERS)})" if unknown
                                         else "no layer given")
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
    top = argparse.ArgumentParser(prog="pytest-dflash", description="pytest-dflash fleet tools")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    merge = commands.add_parser(
        "merge", help="merge per-shard verdict JSONs into one fleet summary (HTML + JSON + JUnit + Prometheus)",
        description="Merge per-host verdict JSONs (files or folders, e.g. one per CI shard) into one fleet "
                    "summary. Exit 0: every host passed (or the gate passed); 1: some host failed (or the gate "
                    "did not pass, or fewer hosts than --expect-hosts); 2: bad input, nothing written; 3: the "
                    "outputs could not be written.")
    merge.add_argument("inputs", nargs="+", metavar="DIR|FILE", help="verdict files or folders of them")
    merge.add_argument("--out", required=True, type=Path, metavar="DIR", help="folder for the summary files")
    merge.add_argument("--previous", type=Path, metavar="SUMMARY.json",
                       help="the previous run's fleet-summary.json, for the trend (default: the one in --out, "
                            "if any)")
    merge.add_argument("--no-previous", action="store_true", help="no trend, even if --out has a summary")
    merge.add_argument("--history", type=Path, metavar="DIR",
                       help="per-host last good verdicts (default: --out/history)")
    merge.add_argument("--prometheus", type=Path, metavar="FILE",
                       help="also write the Prometheus textfile here (atomic), e.g. into node_exporter's "
                            "textfile-collector folder")
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
    if out.exists() and not out.is_dir():
        return _error(f"--out {out}: exists and is not a folder")
    previous: Path | None = None
    if not args.no_previous:
        if args.previous is not None:
            if not args.previous.is_file():
                return _error(f"--previous {args.previous}: no such file")
            previous = args.previous
        elif (out / fleet_summary.SUMMARY_JSON).is_file():
            previous = out / fleet_summary.SUMMARY_JSON
    try:
        verdicts, excluded = fleet_summary.load_verdicts(args.inputs, latest=args.latest, exclude=args.exclude)
        if not verdicts:
            return _error("every verdict was excluded: nothing to summarise")
        if previous is not None:
            fleet_summary.read_summary(previous)  # validate before writing anything
        gate = args.gate or fleet_summary.gate_layers_of(verdicts)
    except fleet_summary.FleetInputError as exc:
        return _error(str(exc))
    try:
        summary, outputs = fleet_summary.summarize(
            verdicts, out, previous_path=previous, history_dir=args.history or out / fleet_summary.HISTORY,
            gate_layers=gate, excluded=excluded, exclude_patterns=args.exclude, prometheus=args.prometheus,
            perf_threshold_pct=args.perf_threshold)
    except OSError as exc:
        print(f"pytest-dflash merge: error: cannot write the summary: {exc}", file=sys.stderr)
        return EXIT_OUTPUT
    except fleet_summary.FleetInputError as exc:
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
        for line in fleet_summary.headline(summary):
            print(f"  {line}")
        if missing:
            print(f"  {missing}")
        for path in outputs.all():
            print(f"  wrote {path}")
    elif missing:
        print(f"pytest-dflash merge: {missing}", file=sys.stderr)
    return status


def _error(message: str) -> int:
    print(f"pytest-dflash merge: error: {message}", file=sys.stderr)
    return EXIT_INPUT


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "merge":
        return merge(args)
    return EXIT_INPUT  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
