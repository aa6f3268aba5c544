#!/usr/bin/env python3
"""Copy one device run into tests/data/: the plugin's outputs verbatim, the server logs trimmed.

    python3 tools/device/record_run.py EXTRACTED_CALL_DIR RUN_NAME DEST_FOLDER [--timeline FILE] [--meta DIR]

EXTRACTED_CALL_DIR holds what run_real_ddtree.sh returned, unpacked: `<run>/` (pytest.log, verdicts, junit,
fleet summary, perf/, the profile as run, server-digest.txt) and `dflash-state-<run>/logs/` (one log per
service). Server logs lose their `GET` probe lines (health, metrics, model info: thousands per run) and keep
at most 40 batch lines and 40 POST lines each (the first 20 and the last 20); every other line — start-up,
`Initialized DDTREE v2 worker`, verify lines, warnings, tracebacks, shutdown — is kept. Nothing else is
edited.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

KEEP_FILES = ("pytest.log", "junit.xml", "fleet-summary.json", "server-digest.txt")
BATCH = re.compile(r"\] (Prefill|Decode) batch")
POST = re.compile(r'"POST /')
GET = re.compile(r'"GET /')
CAP = 40


def trim_log(lines: list[str]) -> list[str]:
    """Drop GET probe lines; keep the first and last CAP/2 of batch lines and of POST lines (a marker
    between)."""
    kept = [line for line in lines if not GET.search(line)]
    for pattern, what in ((BATCH, "batch"), (POST, "POST")):
        hits = [i for i, line in enumerate(kept) if pattern.search(line)]
        if len(hits) <= CAP:
            continue
        dropped = set(hits[CAP // 2:-CAP // 2])
        first_dropped = min(dropped)
        kept = [line if i != first_dropped else f"[record_run.py: {len(dropped)} {what} lines dropped here]\n"
                for i, line in enumerate(kept) if i not in dropped or i == first_dropped]
    return kept


def record(src: Path, run: str, dest: Path, extra: list[Path]) -> list[str]:
    out = []
    dest.mkdir(parents=True, exist_ok=True)
    run_dir = src / run
    for path in sorted(run_dir.iterdir()):
        if path.name in KEEP_FILES or path.name.endswith((".verdict.json", ".toml")):
            shutil.copy2(path, dest / path.name)
            out.append(path.name)
    perf = run_dir / "perf"
    for path in sorted(perf.rglob("*.json")) if perf.is_dir() else []:
        (dest / "perf").mkdir(exist_ok=True)
        shutil.copy2(path, dest / "perf" / path.name)
        out.append(f"perf/{path.name}")
    for log in sorted((src / f"dflash-state-{run}" / "logs").glob("*.log")):
        service = log.name.split(".")[1]  # h200.<service>.<run id>.log
        text = log.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        (dest / f"server_{service}.log").write_text("".join(trim_log(text)), encoding="utf-8")
        out.append(f"server_{service}.log")
    for path in extra:
        shutil.copy2(path, dest / path.name)
        out.append(path.name)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("run")
    parser.add_argument("dest", type=Path)
    parser.add_argument("--extra", type=Path, action="append", default=[], help="another file to copy as is")
    args = parser.parse_args(argv)
    if not (args.src / args.run).is_dir():
        print(f"record_run.py: no {args.src / args.run}/", file=sys.stderr)
        return 2
    for name in record(args.src, args.run, args.dest, args.extra):
        print(f"{args.dest}/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
