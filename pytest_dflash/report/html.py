"""pytest-html integration: the first screen above the (collapsed) Environment table — the run's verdict in
colour, the gate and why, each failing host's diagnosis, what changed (report/first_screen.py) —, the
diagnosis as a highlighted extra in each failed row (dark on pale), Host / Layer / Service /
Diagnosis columns (sortable, like pytest-html's own), the run's metadata in the Environment table (through
pytest-metadata: run id, plugin version, the SGLang / torch / FlashInfer versions seen), and the host x layer
verdict table at the top of the report, each host's cold start as a timeline (services side by side, phases
coloured: report/plots.py) over a table of the same phases as columns, each host's load sweep in pictures
(report/sweep_section.py), a skipped row's reason as a sentence
(not pytest's (path, line, reason) tuple), and a title that names the run's hosts and verdicts instead of the
file name. (The journal tails already appear in each row's log block, because they are report sections.)
Registered only when pytest-html is active."""

from __future__ import annotations

import html
from collections.abc import Callable, Generator, Mapping
from typing import TYPE_CHECKING, Any

import pytest

from pytest_dflash import __version__
from pytest_dflash.config.layers import LAYERS
from pytest_dflash.report.ranks import rank_lines
from pytest_dflash.scrub.redact import redact

if TYPE_CHECKING:
    from pytest_dflash.report.verdict import HostVerdict, VerdictBuilder

COLOURS = {"passed": "#2e7d32", "failed": "#c62828", "blocked": "#ef6c00", "skipped": "#757575",
           "not-run": "#bdbdbd"}
# a host's verdict, as the verdict file says it (report/verdict.py: final_verdict): never a partial in green
VERDICT_COLOURS = {"pass": "#2e7d32", "fail": "#c62828", "partial": "#ef6c00", "interrupted": "#6a1b9a"}
# A skipped row's log block holds one sentence (pytest_html_results_table_html): no 230 px scroll box with an
# expand button around it (pytest-html's .logwrapper), just the line.
SKIP_CSS = (".logwrapper:has(.dflash-skip-reason){max-height:none;overflow:visible;background:none}"
            ".logwrapper:has(.dflash-skip-reason) .logexpander{display:none}"
            ".logwrapper:has(.dflash-skip-reason) .log{top:0;height:auto;min-height:0;padding:4px 0}")
# the diagnosis box in a failed row: near-black on a pale red (pytest-html's log CSS greys text; 15:1 here)
DIAGNOSIS_BOX = "border-left:4px solid #c62828;padding:6px 10px;background:#fff3f3;color:#1a1a1a"
COLUMNS = (("host", "Host"), ("layer", "Layer"), ("service", "Service"), ("diagnosis", "Diagnosis"))
# Where a version seen on a host comes from, first found wins: (verdict fact, field); SGLang from
# /server_info. The env layer exports "torch" (torch's own facts, GPU hosts) and "serving_stack" (installed
# distributions).
VERSION_FACTS = {
    "torch": (("torch", "version"), ("serving_stack", "torch")),
    "FlashInfer": (("serving_stack", "flashinfer-python"), ("serving_stack", "flashinfer_python"),
                   ("serving_stack", "flashinfer")),
}


# {failing host: fleet/trend.py's what_changed, or None with no good run on record}
Changes = Callable[[pytest.Config], Mapping[str, Mapping[str, Any] | None]]


class HtmlHooks:
    def __init__(self, config: pytest.Config, *, changes: Changes | None = None) -> None:
        self.config = config
        # what changed on each failing host since its last good run: fleet/changes.py reads the history
        # (a package above this one, so plugin.py hands it in)
        self._changes = changes
        self._page: Any = None  # pytest-html's report data: its title is read when the page is written

    def pytest_html_report_title(self, report: Any) -> None:
        self._page = report  # the hosts' verdicts are known only at the end: the title is set then

    def pytest_html_results_table_html(self, report: pytest.TestReport, data: list[str]) -> None:
        """A skip's log block: the reason as a sentence with where it was raised, not the tuple's repr."""
        if (report.skipped and isinstance(report.longrepr, tuple | list) and len(report.longrepr) == 3
                and data):
            path, line, reason = report.longrepr
            sentence = html.escape(redact(skip_sentence(str(path), line, str(reason))))
            data[0] = f'<span class="dflash-skip-reason">{sentence}</span>\n'

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item,
                                  call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        report: pytest.TestReport = yield
        if not report.failed:
            return report
        from pytest_html import extras

        for title, body in report.sections:
            if title == "dflash diagnosis":
                box = (f'<div class="dflash-diagnosis" style="{DIAGNOSIS_BOX}"><b>dflash diagnosis</b>'
                       f'<pre style="white-space:pre-wrap;color:#1a1a1a;background:none;margin:4px 0 0">'
                       f"{html.escape(body)}</pre></div>")
                report.extras = [*getattr(report, "extras", []), extras.html(box)]  # type: ignore[attr-defined]
        return report

    def pytest_html_results_table_header(self, cells: list[str]) -> None:
        at = _after_test_column(cells, "testId")
        cells[at:at] = [f'<th class="sortable" data-column-type="{key}">{title}</th>'
                        for key, title in COLUMNS]

    def pytest_html_results_table_row(self, report: pytest.TestReport | pytest.CollectReport,
                                      cells: list[str]) -> None:
        properties = getattr(report, "user_properties", ())  # a collection error's row has none
        info = next((v for k, v in properties if k == "dflash" and isinstance(v, dict)), {})
        diagnoses = [d for d in info.get("diagnosis") or () if isinstance(d, dict)]
        values = {
            "host": (str(info.get("host", "")), ""),
            "layer": (str(info.get("layer", "")), ""),
            "service": (", ".join(str(s) for s in info.get("services") or ()), ""),
            "diagnosis": (", ".join(str(d.get("id", "")) for d in diagnoses),
                          "; ".join(f"[{d.get('id', '')}] {d.get('title', '')}" for d in diagnoses)),
        }
        at = _after_test_column(cells, "col-testId")
        cells[at:at] = [f'<td class="col-{key}"{_title(values[key][1])}>'
                        f'{html.escape(redact(values[key][0]))}</td>'
                        for key, _ in COLUMNS]

    def pytest_html_results_summary(self, prefix: list[str], summary: list[str], postfix: list[str]) -> None:
        from pytest_dflash.report.verdict import BUILDER_KEY

        builder = self.config.stash.get(BUILDER_KEY, None)
        self._metadata(builder)
        if builder is None or not builder.hosts:
            return
        prefix.append(self._first_screen(builder))
        if self._page is not None:
            self._page.title = run_title(builder)
        head = "".join(f"<th>{'host layer' if layer == 'host' else layer}</th>" for layer in LAYERS)
        rows = []
        for name, verdict in sorted(builder.hosts.items()):
            cells = "".join(
                f'<td style="color:{COLOURS[outcome]};font-weight:bold">{outcome}</td>'
                for outcome in verdict.layer_outcomes().values()
            )
            final = verdict.final_verdict(builder.status)
            rows.append(f'<tr data-host="{html.escape(name)}"><td>{html.escape(name)}</td><td '
                        f'class="dflash-host-verdict" style="color:{VERDICT_COLOURS[final]}">'
                        f"<b>{final.upper()}</b></td>{cells}</tr>")
            rows += [f'<tr><td></td><td colspan="{len(LAYERS) + 1}">{html.escape(redact(why))}</td></tr>'
                     for why in verdict_reasons(verdict, builder)]
            rows += [f'<tr class="dflash-rank"><td></td><td colspan="{len(LAYERS) + 1}">RANK '
                     f"{html.escape(redact(line))}</td></tr>" for line in rank_lines(verdict.services)]
            for failure in verdict.failures:
                diagnosis = "; ".join(
                    f"[{d['id']}] {d['subject'] + ': ' if d.get('subject') else ''}{d['title']}"
                    + (f" — remedy: {d['remedy']}" if d.get("remedy") else "")
                    for d in failure.get("diagnosis", [])[:2])
                rows.append(f'<tr><td></td><td colspan="{len(LAYERS) + 1}">FAILED '
                            f'{html.escape(failure["test"])}: '
                            f"{html.escape(diagnosis or failure['message'])}</td></tr>")
        style = ("<style>table.dflash-verdict{border-collapse:collapse;margin-bottom:1em}"
                 "table.dflash-verdict th,table.dflash-verdict td{border:1px solid #ddd;padding:3px 8px;"
                 "text-align:left;color:#1a1a1a}table.dflash-verdict td:first-child{white-space:nowrap}"
                 + SKIP_CSS + "</style>")
        prefix.append(f'{style}<h2>dflash verdict</h2><table '
                      f'class="dflash-verdict"><tr><th>host</th><th>verdict</th>'
                      f"{head}</tr>{''.join(rows)}</table>")
        prefix.append(cold_start_section(builder))
        prefix.append(self._sweeps(builder))

    def _sweeps(self, builder: VerdictBuilder) -> str:
        """Each host's load sweep of this run, in pictures (report/sweep_section.py)."""
        from pytest_dflash.report.sweep_section import sweep_section
        from pytest_dflash.run.stash import RUN_KEY

        run = self.config.stash.get(RUN_KEY, None)
        if run is None:
            return ""
        return sweep_section(run.options.report_dir, {name: v.metrics for name, v in builder.hosts.items()})

    def _first_screen(self, builder: VerdictBuilder) -> str:
        """Verdict, gate and why, and what changed (report/first_screen.py), above the Environment table."""
        from pytest_dflash.report.first_screen import first_screen
        from pytest_dflash.run.stash import GATE_KEY

        gate_layers = self.config.stash.get(GATE_KEY, [])
        gate = builder.gate(gate_layers) if gate_layers else None
        return first_screen(builder, gate, self._changes(self.config) if self._changes else {})

    def _metadata(self, builder: VerdictBuilder | None) -> None:
        """The run's facts into pytest-metadata's dict, which pytest-html renders as its Environment table (it
        holds that very dict from session start, so what is added before the report is written shows)."""
        try:
            from pytest_metadata.plugin import metadata_key  # type: ignore[import-untyped]
        except ImportError:  # pytest-html without pytest-metadata: no Environment table to add to
            return
        metadata = self.config.stash.get(metadata_key, None)
        if metadata is None:
            return
        metadata["dflash plugin"] = __version__
        if builder is None:
            return
        metadata["dflash run id"] = builder.run_id
        for name, versions in versions_seen(builder).items():
            metadata[name] = redact(versions)
        # the served speculation of each speculative service, and how the server says it was started
        for host, verdict in sorted(builder.hosts.items()):
            for service, facts in sorted(verdict.services.items()):
                if isinstance(facts.get("speculation"), dict):
                    metadata[f"speculation {host}/{service}"] = redact(", ".join(
                        f"{key.removeprefix('speculative_')}={value}"
                        for key, value in facts["speculation"].items()))
                if isinstance(facts.get("launch_command"), str):
                    metadata[f"launch command {host}/{service}"] = redact(facts["launch_command"])
                if isinstance(facts.get("frontend"), str):
                    metadata[f"frontend {host}/{service}"] = redact(facts["frontend"])


def verdict_reasons(verdict: HostVerdict, builder: VerdictBuilder) -> list[str]:
    """Why a host is not PASS beyond its failures, as the terminal says it: 'INTERRUPTED: …', 'PARTIAL: …'."""
    final = verdict.final_verdict(builder.status)
    if final == "interrupted":
        return [f"INTERRUPTED: {verdict.interrupted_reason(builder.status)}"]
    if final == "partial":
        return [f"PARTIAL: {why}" for why in verdict.partial_reasons(builder.status)]
    return [f"OUTSIDE THE DFLASH TESTS: {problem}" for problem in builder.status.foreign]


def run_title(builder: VerdictBuilder) -> str:
    """'pytest-dflash h200: FAIL' / 'pytest-dflash, 32 hosts: 31 pass, 1 fail (gpu-17)': each host's verdict
    as its verdict file says it (partial and interrupted too), read from the same builder and run status."""
    verdicts = {name: v.final_verdict(builder.status) for name, v in sorted(builder.hosts.items())}
    if len(verdicts) == 1:
        ((name, verdict),) = verdicts.items()
        return f"pytest-dflash {name}: {verdict.upper()}"
    counts: dict[str, list[str]] = {}
    for name, verdict in verdicts.items():
        counts.setdefault(verdict, []).append(name)
    parts = []
    for verdict, names in sorted(counts.items(), key=lambda kv: kv[0] != "pass"):
        shown = "" if verdict == "pass" else f" ({', '.join(names[:3])}{', …' if len(names) > 3 else ''})"
        parts.append(f"{len(names)} {verdict}{shown}")
    return f"pytest-dflash, {len(verdicts)} hosts: {', '.join(parts)}"


def skip_sentence(path: str, line: int | None, reason: str) -> str:
    """pytest's ('<path>/suites/env/test_env.py', 47, 'Skipped: no service of h200 …') -> 'Skipped: no service
    of h200 … (suites/env/test_env.py, line 47)'."""
    reason = reason.strip()
    if not reason.lower().startswith("skipped"):
        reason = f"Skipped: {reason}"
    where = path
    for marker in ("/suites/", "/tests/"):
        if marker in path:
            where = path[path.index(marker) + 1:]
            break
    # 1-based, as pytest's SKIPPED line prints it
    line_text = f", line {line}" if isinstance(line, int) else ""
    return f"{reason} ({where}{line_text})"


# the phase table under each timeline: headers apart, padded, dark text (pytest-html's own CSS greys tables)
PHASES_CSS = ("<style>table.dflash-cold-start-phases{border-collapse:collapse;margin:4px 0 14px}"
              "table.dflash-cold-start-phases th,table.dflash-cold-start-phases td{border:1px solid #ccc;"
              "padding:3px 8px;color:#222;text-align:right}"
              "table.dflash-cold-start-phases th{background:#f0f0f0;text-align:left}</style>")


def cold_start_section(builder: VerdictBuilder) -> str:
    """Each host's cold start: its services' readiness on one clock, phases coloured, the ones that never
    became ready first, drawn up to where they stopped; '' when no service has readiness facts (nothing was
    started or attached in this run)."""
    from pytest_dflash.report.plots import (
        cold_start_phases,
        cold_start_timeline_svg,
        phase_legend_svg,
        stopped_phases,
    )

    blocks, phases = [], set()
    # failing hosts first; one legend for the page
    for name, verdict in sorted(builder.hosts.items(), key=lambda kv: (kv[1].verdict == "pass", kv[0])):
        ready = {svc: facts["ready"] for svc, facts in sorted(verdict.services.items())
                 if isinstance(facts.get("ready"), dict)}
        # a service that never became ready is drawn too, saying where it stopped (its service-layer failure)
        failed = {svc: str(f["message"]).strip().splitlines()[0] for f in verdict.failures
                  if f.get("layer") == "service" for svc in f.get("services") or [] if svc not in ready}
        stopped = {svc: facts["stopped"] for svc, facts in verdict.services.items()
                   if svc in failed and isinstance(facts.get("stopped"), dict)}
        svg = cold_start_timeline_svg(ready, title=f"{name}: cold start", legend=False, failed=failed,
                                      stopped=stopped)
        if svg is not None:
            drawn = [*map(cold_start_phases, ready.values()), *map(stopped_phases, stopped.values())]
            phases |= {phase for row in drawn for phase, _, _ in row}
            table = cold_start_table(ready, stopped) if ready or stopped else ""
            blocks.append(f'<div class="dflash-cold-start" data-host="{html.escape(name)}">{svg}'
                          f"{table}</div>")
    if not blocks:
        return ""
    return ("<h2>dflash cold start</h2>" + PHASES_CSS + (phase_legend_svg(phases) or "") + "".join(blocks))


def cold_start_table(ready: dict[str, Any], stopped: dict[str, Any] | None = None) -> str:
    """The timeline's numbers as columns: one row per service (the ones that never became ready first), one
    column per phase (its duration, and when it ended from the start of that service's wait), then the total
    or where it stopped; a phase a service never logged is blank."""
    from pytest_dflash.report.plots import (
        cold_start_phases,
        phase_order,
        phase_style,
        stopped_in,
        stopped_phases,
    )

    stopped = stopped or {}
    rows = {svc: {phase: (start, end) for phase, start, end in stopped_phases(facts)}
            for svc, facts in stopped.items()}
    rows |= {svc: {phase: (start, end) for phase, start, end in cold_start_phases(facts)}
             for svc, facts in ready.items()}
    columns = phase_order(phase for phases in rows.values() for phase in phases)
    head = "".join(f"<th>{html.escape(phase_style(p)[0])}</th>" for p in columns)
    body = []
    for svc, phases in rows.items():
        cells = []
        for phase in columns:
            if phase in phases:
                start, end = phases[phase]
                cells.append(f'<td data-phase="{html.escape(phase)}" title="ended at +{end:.1f} s">'
                             f"{end - start:.1f} s</td>")
            else:
                cells.append("<td></td>")
        if svc in ready:
            total = max((end for _, end in phases.values()), default=0.0)
            body.append(f"<tr><th>{html.escape(svc)}</th>{''.join(cells)}<td>{total:.1f} s</td></tr>")
        else:
            facts = stopped[svc]
            waited = float(facts.get("total_s") or 0.0)
            body.append(f'<tr class="dflash-never-ready"><th>{html.escape(svc)}</th>{"".join(cells)}'
                        f'<td style="color:#c62828">never ready: stopped {html.escape(stopped_in(facts))} '
                        f"after {waited:.1f} s</td></tr>")
    return (f'<table class="dflash-cold-start-phases"><tr><th>service</th>{head}<th>ready after</th>'
            f"</tr>{''.join(body)}</table>")


def versions_seen(builder: VerdictBuilder) -> dict[str, str]:
    """{'SGLang': '0.5.17', 'torch': '2.9.1+cu129 (gpu-a), 2.8.0 (gpu-b)', …}: each version the run saw,
    naming the hosts only when they differ; a version nobody reported is left out."""
    seen: dict[str, dict[str, set[str]]] = {}
    for host, verdict in sorted(builder.hosts.items()):
        for facts in verdict.services.values():
            if facts.get("version"):
                seen.setdefault("SGLang", {}).setdefault(str(facts["version"]), set()).add(host)
        for name, sources in VERSION_FACTS.items():
            found = (verdict.facts.get(key) for key, _ in sources)
            version = next((fact[field] for fact, (_, field) in zip(found, sources, strict=True)
                            if isinstance(fact, dict) and fact.get(field)), None)
            if version:
                seen.setdefault(name, {}).setdefault(str(version), set()).add(host)
    out = {}
    for name, versions in seen.items():
        if len(versions) == 1:
            out[name] = next(iter(versions))
        else:
            out[name] = ", ".join(f"{v} ({', '.join(sorted(hosts))})"
                                  for v, hosts in sorted(versions.items()))
    return out


def _after_test_column(cells: list[str], marker: str) -> int:
    """Where the dflash columns go: right after pytest-html's Test column (at the end if it is not there)."""
    return next((i + 1 for i, cell in enumerate(cells) if marker in cell), len(cells))


def _title(text: str) -> str:
    return f' title="{html.escape(redact(text))}"' if text else ""
