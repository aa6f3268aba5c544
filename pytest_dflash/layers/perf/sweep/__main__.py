"""``python -m pytest_dflash.layers.perf.sweep FILE... --host NAME [--slo ttft_p99_ms=500] --out FILE``: a
sweep's curve (curve.py's data model) from load-run JSON files made elsewhere, one per service per level
(`python -m pytest_dflash.load URL --out dflash-c16.json --concurrency 16`), and its lines on stdout."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_dflash.layers.perf.sweep.book import curve_lines
from pytest_dflash.layers.perf.sweep.build import curve_from_files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_dflash.layers.perf.sweep", description=__doc__)
    parser.add_argument("files", nargs="+", type=Path, help="load-run JSON files, or folders of them")
    parser.add_argument("--host", required=True, help="the host's name in the curve")
    parser.add_argument("--slo", action="append", default=[], metavar="KEY=MS",
                        help="an objective every level is judged against, e.g. ttft_p99_ms=500 (repeatable)")
    parser.add_argument("--out", type=Path, help="write the curve's JSON here")
    parser.add_argument("--max-loop-lag-ms", type=float, default=None,
                        help="judge each run's client saturation again with this event-loop lag limit")
    args = parser.parse_args(argv)
    slo: dict[str, float] = {}
    for item in args.slo:
        key, _, value = item.partition("=")
        try:
            slo[key] = float(value)
        except ValueError:
            parser.error(f"--slo {item!r}: expected KEY=MS, e.g. ttft_p99_ms=500")
    paths = [p for f in args.files
             for p in (sorted([*f.rglob("*.json"), *f.rglob("*.json.gz")]) if f.is_dir() else [f])]
    try:
        curve = curve_from_files(paths, host=args.host, slo=slo, max_loop_lag_ms=args.max_loop_lag_ms)
    except (ValueError, OSError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in curve_lines(curve):
        print(line)
    if args.out is not None:
        args.out.write_text(curve.to_json(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
