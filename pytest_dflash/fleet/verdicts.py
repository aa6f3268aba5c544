"""The merge's input: per-host verdict files found, read, checked for consistency and deduplicated
(:func:`load_verdicts`), and the history of each host's last good verdict (:class:`History`)."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_dflash.documents import loads_json
from pytest_dflash.errors import DocumentTooDeep
from pytest_dflash.files import atomic_write
from pytest_dflash.fleet.values import parse_time, safe_name
from pytest_dflash.report.verdict import SCHEMA as VERDICT_SCHEMA
from pytest_dflash.report.verdict import VERDICTS, LayerTally

HISTORY = "history"
LAST_GOOD = "last-good.verdict.json"
VERDICT_GLOB = "*.verdict.json"


class FleetInputError(Exception):
    """Bad input to a merge: one line, naming the file and what is wrong."""


@dataclass(frozen=True)
class LoadedVerdict:
    path: Path
    data: dict[str, Any]

    @property
    def host(self) -> str:
        return str(self.data["host"])

    @property
    def run_id(self) -> str:
        return str(self.data.get("run_id") or "")

    @property
    def finished_ts(self) -> float | None:
        return parse_time(self.data.get("finished"))

    @property
    def passed(self) -> bool:
        return self.data.get("verdict") == "pass"


# ---- input ----------------------------------------------------------------------------------------------


def find_verdict_files(inputs: Iterable[str | Path]) -> list[Path]:
    """Every verdict file named by the inputs: a file, or a folder searched recursively (shard artifacts are
    often one sub-folder each) for *.verdict.json, skipping history/ folders (last-good copies)."""
    files: list[Path] = []
    for raw in inputs:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob(VERDICT_GLOB)
                           if p.is_file() and HISTORY not in p.relative_to(path).parts[:-1])
            if not found:
                raise FleetInputError(f"{path}: no {VERDICT_GLOB} files in this folder")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise FleetInputError(f"{path}: no such file or folder")
    return files


def read_verdict(path: Path) -> dict[str, Any]:
    """One verdict file, checked enough that a summary can be built from it."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FleetInputError(f"{path}: cannot read: {exc}") from None
    try:
        data = loads_json(text)
    except DocumentTooDeep as exc:
        raise FleetInputError(f"{path}: not a pytest-dflash verdict ({exc})") from None
    except json.JSONDecodeError as exc:
        raise FleetInputError(
            f"{path}: not a pytest-dflash verdict (not JSON: {exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or data.get("schema") != VERDICT_SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise FleetInputError(f"{path}: not a pytest-dflash verdict (schema {found!r}, expected "
                              f"{VERDICT_SCHEMA!r})")
    problems = []
    if not isinstance(data.get("host"), str) or not data["host"]:
        problems.append("'host' must be a non-empty string")
    if data.get("verdict") not in VERDICTS:
        problems.append(f"'verdict' must be one of {', '.join(VERDICTS)}")
    if not isinstance(data.get("layers"), dict):
        problems.append("'layers' must be an object")
    for key in ("failures", "blocked"):
        if not isinstance(data.get(key, []), list):
            problems.append(f"'{key}' must be a list")
    for key in ("services", "metrics", "facts"):
        if not isinstance(data.get(key) or {}, dict):
            problems.append(f"'{key}' must be an object")
    if problems:
        raise FleetInputError(f"{path}: invalid verdict: {problems[0]}")
    if (why := inconsistency(data)) is not None:
        raise FleetInputError(f"{path}: inconsistent verdict, refused: {why}")
    return data


_TALLY_KEYS = ("passed", "failed", "blocked", "skipped")


def inconsistency(data: Mapping[str, Any]) -> str | None:
    """Why a verdict file contradicts itself (None: it does not). A merge trusts no 'pass' that its own
    layers, failures, completeness or exit code deny: such a file was edited, damaged or written by a broken
    tool."""
    verdict = data["verdict"]
    outcomes: dict[str, str] = {}
    for layer, body in data["layers"].items():
        if not isinstance(body, Mapping):
            return f"layer {layer!r} is not an object"
        outcome = str(body.get("outcome", "not-run"))
        counts = {key: body[key] for key in _TALLY_KEYS if key in body}
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts.values()):
            return f"layer {layer!r} has counts that are not whole numbers: {counts}"
        if counts:
            tally = LayerTally(**counts)
            if tally.outcome != outcome:
                return f"layer {layer!r} says {outcome!r} but its counts {counts} make it {tally.outcome!r}"
        outcomes[layer] = outcome
    bad_layers = [layer for layer, outcome in outcomes.items() if outcome in ("failed", "blocked")]
    interrupted, partial = data.get("interrupted"), data.get("partial") or []
    failures, blocked, foreign = (data.get("failures") or [], data.get("blocked") or [],
                                  data.get("foreign") or [])
    exit_code = data.get("exit_code")
    if bool(interrupted) != (verdict == "interrupted"):
        return f"'verdict' is {verdict!r} but 'interrupted' is {interrupted!r}"
    if exit_code is None and verdict != "interrupted":
        return f"'verdict' is {verdict!r} but 'exit_code' is null (a run that never finished)"
    if "complete" in data and data["complete"] != (not interrupted and not partial):
        return (f"'complete' is {data['complete']!r} but 'interrupted' is {interrupted!r} "
                f"and 'partial' {partial!r}")
    if verdict == "pass":
        if bad_layers:
            return f"'verdict' is 'pass' but layer {bad_layers[0]!r} {outcomes[bad_layers[0]]}"
        if failures or blocked or foreign:
            return "'verdict' is 'pass' but it lists failed or blocked tests"
        if partial:
            return f"'verdict' is 'pass' but 'partial' says {partial[0]!r}"
        if data.get("tests_verdict", "pass") != "pass":
            return f"'verdict' is 'pass' but 'tests_verdict' is {data.get('tests_verdict')!r}"
        if not any(outcome == "passed" for outcome in outcomes.values()):
            return "'verdict' is 'pass' but no layer passed (a run where nothing passed is partial)"
        if isinstance(exit_code, bool) or exit_code not in (0, 1):
            return (f"'verdict' is 'pass' but the run exited {exit_code!r} "
                    f"(0, or 1 for another host's failure)")
    elif verdict == "fail":
        if not (bad_layers or failures or blocked or foreign):
            return "'verdict' is 'fail' but no layer failed or was blocked and no test failed"
        gate = data.get("gate") or {}
        if exit_code == 0 and not gate.get("passed"):
            return "'verdict' is 'fail' but the run exited 0 without a gate that passed"
    elif verdict == "partial":
        if not partial:
            return "'verdict' is 'partial' but 'partial' gives no reason"
        if bad_layers or failures or blocked:
            return "'verdict' is 'partial' but a layer failed or was blocked"
    elif exit_code == 0:
        return "'verdict' is 'interrupted' but the run exited 0"
    return None


def load_verdicts(inputs: Iterable[str | Path], *, latest: bool = False,
                  exclude: Sequence[str] = ()) -> tuple[list[LoadedVerdict], list[str]]:
    """(verdicts, excluded host names). Two files for one host are one verdict when their content is the same
    (the same artifact downloaded twice); otherwise an error, or with `latest` the one that finished last."""
    by_host: dict[str, LoadedVerdict] = {}
    excluded: set[str] = set()
    for path in find_verdict_files(inputs):
        loaded = LoadedVerdict(path, read_verdict(path))
        if any(fnmatch.fnmatchcase(loaded.host, pattern) for pattern in exclude):
            excluded.add(loaded.host)
            continue
        other = by_host.get(loaded.host)
        if other is None or other.data == loaded.data:
            by_host.setdefault(loaded.host, loaded)
            continue
        newer = _newer(other, loaded)
        if not latest or newer is None:
            raise FleetInputError(
                f"conflicting verdicts for host {loaded.host!r}: {other.path} (run {other.run_id}, finished "
                f"{other.data.get('finished')}) and {loaded.path} (run {loaded.run_id}, finished "
                f"{loaded.data.get('finished')})" + (""
                                                     if latest else "; pass --latest to keep the newer one"))
        by_host[loaded.host] = newer
    return [by_host[name] for name in sorted(by_host)], sorted(excluded)


def _newer(a: LoadedVerdict, b: LoadedVerdict) -> LoadedVerdict | None:
    ta, tb = a.finished_ts, b.finished_ts
    if ta is None or tb is None or ta == tb:
        return None
    return a if ta > tb else b


# ---- history: the last good verdict of every host ---------------------------------------------------------


class History:
    """`<root>/<host>/last-good.verdict.json`: a copy of the newest passing verdict of each host."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, host: str) -> Path:
        return self.root / safe_name(host) / LAST_GOOD

    def last_good(self, host: str) -> dict[str, Any] | None:
        path = self.path(host)
        if not path.is_file():
            return None
        try:
            data = read_verdict(path)
        except FleetInputError:
            return None  # a damaged copy is as good as none; the next passing run replaces it
        return data if data.get("host") == host and data.get("verdict") == "pass" else None

    def record(self, verdicts: Iterable[LoadedVerdict]) -> list[Path]:
        """Store the passing verdicts that are newer than the host's stored one; returns the paths written."""
        written = []
        for verdict in verdicts:
            if not verdict.passed:
                continue
            path = self.path(verdict.host)
            current = self.last_good(verdict.host)
            if current is not None:
                if (current.get("run_id") == verdict.run_id
                        and current.get("finished") == verdict.data.get("finished")):
                    continue
                stored = parse_time(current.get("finished"))
                if stored is not None and (verdict.finished_ts or 0.0) < stored:
                    continue  # an older artifact merged late never replaces a newer good verdict
            atomic_write(path, json.dumps(verdict.data, indent=1, default=str) + "\n", sync=False)
            written.append(path)
        return written
