"""Service-layer checks, one per suite test (suites/service/): each takes a ServiceHandle, skips with the
reason where it cannot apply, and fails with the evidence (the unit's state, the server's own answers)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, NoReturn

from pytest_dflash.errors import DflashError
from pytest_dflash.layers.generation import checks as generation
from pytest_dflash.run import skips
from pytest_dflash.services import speculation
from pytest_dflash.services.served import ServedConfig, command_of
from pytest_dflash.services.startup import ReadyReport

if TYPE_CHECKING:
    from pytest_dflash.run.handle import ServiceHandle

STAY_UP_S = 2.0  # the seed's service was "active" 2-3 s before it died


def _fail(message: str) -> NoReturn:
    __tracebackhide__ = True
    raise AssertionError(message)


def ready_by_real_generation(service: ServiceHandle) -> ReadyReport:
    """Ready = a real greedy AND a real sampled generation succeeded (ensure_ready raises otherwise)."""
    __tracebackhide__ = True
    report = service.ensure_ready()
    if report.greedy_s is None or report.sampled_s is None:
        _fail(f"{service.label}: readiness finished without a greedy and a sampled generation ({report})")
    return report


def serves_the_profiles_algorithm(service: ServiceHandle) -> None:
    """/server_info speculative_algorithm is the profile's (or, attached, the one read at collection)."""
    __tracebackhide__ = True
    if unknown := service.algorithm_unknown:
        skips.not_applicable(f"{service.label}: its speculative algorithm is unknown: {unknown}")
    if service.spec.discovery_error is None:
        skips.needs_sglang(service, "needs SGLang's /server_info")
    if reason := generation.served_algorithm_unknown(service):
        skips.could_not_check(f"{service.label}: {reason}")
    generation.check_served_algorithm(service)


def has_not_restarted(service: ServiceHandle) -> None:
    """No death and NRestarts = 0 since the service started (Restart= hides crash loops from is-active)."""
    __tracebackhide__ = True
    if not service.host.has_host_access:
        skips.not_applicable("attached by URL: no unit to inspect")
    state = service.manager.state()
    if state.death is not None:
        _fail(f"{service.label}: {state.summary()}")
    if state.restarts:
        _fail(f"{service.label}: NRestarts={state.restarts}: it crashed and was restarted since it started "
              "(Restart= hides crash loops from is-active); the journal shows the earlier crash")


def stays_up(service: ServiceHandle, seconds: float = STAY_UP_S) -> None:
    """No death, restart or lost connection in the seconds after readiness (watched every 0.25 s)."""
    __tracebackhide__ = True
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        problem = service.check_alive()
        if problem is not None:
            _fail(str(problem))
        time.sleep(0.25)


def health_answers(service: ServiceHandle) -> None:
    """/v1/models lists a model; on SGLang's native API /health_generate answers 200 (with
    SGLANG_DIAG_BYPASS_HEALTH_GENERATE set that 200 is no generation: a note says so)."""
    __tracebackhide__ = True
    if not service.client.models():
        _fail(f"{service.label}: /v1/models lists no model")
    if service.native:
        status = service.client.health_generate(timeout_s=30)
        if status != 200:
            _fail(f"{service.label}: /health_generate answered {status} after readiness")
        if bypassed := service.health_bypassed:
            service.host.notes.append(f"{service.label}: its /health_generate 200 proves no generation: "
                                      f"{bypassed}")


def served_models(service: ServiceHandle) -> dict[str, Any]:
    """What the server says it serves, from each endpoint that says it: /v1/models ids, /model_info
    model_path, /server_info model_path and served_model_name (SGLang's /v1/models id is the served name)."""
    said: dict[str, Any] = {"/v1/models": service.client.models()}
    if service.native:
        model_info = service.client.model_info() or {}
        server_info = service.server_info or {}
        said["/model_info model_path"] = model_info.get("model_path")
        said["/server_info model_path"] = server_info.get("model_path")
        said["/server_info served_model_name"] = server_info.get("served_model_name")
    return said


def model_problems(said: dict[str, Any], profile_model: str | None) -> list[str]:
    """Where the server's endpoints disagree with each other or with the profile's `model` (empty: they
    agree)."""
    problems = []
    listed = [str(m) for m in said.get("/v1/models") or []]
    paths = {str(said[k]) for k in ("/model_info model_path", "/server_info model_path") if said.get(k)}
    if len(paths) > 1:
        problems.append(f"/model_info and /server_info name different model paths: {sorted(paths)}")
    served = said.get("/server_info served_model_name") or next(iter(paths), None)
    if served is not None and listed and str(served) not in listed:
        problems.append(f"/v1/models lists {listed}, /server_info serves {served!r}")
    if profile_model is not None:
        known = set(listed) | paths | ({str(served)} if served else set())
        if profile_model not in known:
            problems.append(f"the profile's model {profile_model!r} is none of what the server names: "
                            f"{sorted(known) or 'nothing'}")
    return problems


def serves_one_consistent_model(service: ServiceHandle) -> None:
    """/v1/models, /model_info and /server_info name the same model, and it is the profile's `model`
    if set."""
    __tracebackhide__ = True
    said = served_models(service)
    if not service.native and (expected := skips.sglang_expected(service)):
        service.host.notes.append(f"{service.label}: only /v1/models was compared (/model_info and "
                                  f"/server_info not read: {expected})")
    problems = model_problems(said, service.spec.model)
    if problems:
        _fail(f"{service.label}: " + "; ".join(problems) + f" (the server said: {said})")


def _log_text(service: ServiceHandle, lines: int = 20000) -> str:
    try:
        return service.manager.logs_since(service.started_mark, lines)
    except DflashError:
        return ""


def serves_the_profiles_speculation(service: ServiceHandle) -> speculation.Findings:
    """The speculation /server_info reports (a fact of the verdict) is what the profile's command asks for,
    and the server's log shows no greedy-verification fallback; other quietly changed settings
    become notes. SGLang 0.5.20+ says how it was started (/server_info launch_command): without a command in
    the profile (attached by URL, a unit without a template) that is what was asked; with one, a speculative
    flag the two disagree on fails (a stale or edited unit), any other is a note."""
    __tracebackhide__ = True
    skips.needs_sglang(service, "needs SGLang's /server_info")
    if service.server_info is None:
        skips.could_not_check(f"{service.label}: /server_info did not answer: the served speculation is "
                              "unknown")
    served = speculation.served_speculation(service.server_info)
    if not service.spec.speculative and not served:
        skips.not_applicable(f"{service.label} does not use speculative decoding")
    launch = speculation.launch_argv(service.server_info)
    command = service.spec.command
    requested = speculation.requested_speculation(command or launch or ())
    asked = "asked"
    if not command and launch is not None:
        asked = "asked (from the server's launch_command)"
        service.host.notes.append(f"{service.label}: requested: from the server's launch_command (its "
                                  f"profile has no command): {requested or 'no speculative flags'}")
    algorithm = service.spec.algorithm if service.spec.speculative else None
    concurrency = service.host.profile.perf.get("concurrency")
    findings = speculation.compare(requested, served, _log_text(service), algorithm=algorithm,
                                   perf_concurrency=concurrency if isinstance(concurrency, int) else None)
    if command and launch is not None:
        drift = speculation.launch_drift(command, launch)
        findings.failures[:0] = drift.failures
        findings.notes += drift.notes
    for note in findings.notes:
        service.host.notes.append(f"{service.label}: {note}")
    if findings.failures:
        _fail(f"{service.label} does not serve the speculation its profile asks for: "
              + "; ".join(findings.failures)
              + f" (served: {served or 'no speculation'}; {asked}: {requested or 'no speculative flags'})")
    return findings


def serves_the_commands_configuration(service: ServiceHandle) -> ServedConfig:
    """The parsers, grammar backend and parallel sizes /server_info reports are the ones the service's command
    sets, on every such flag it names (services/served.py): a contradiction fails, naming both; what the
    command leaves out is SGLang's to choose. Without a command there is nothing to compare: what it serves
    is read from /server_info (the verdict's fact `served`)."""
    __tracebackhide__ = True
    skips.needs_sglang(service, "needs SGLang's /server_info")
    if service.server_info is None:
        skips.could_not_check(f"{service.label}: /server_info did not answer: what it serves is unknown")
    served = service.served
    if not command_of(service.spec):
        shown = "; ".join(s.describe() for s in served.settings if s.known)
        skips.not_applicable(f"{service.label}: its profile has no command to compare: what it serves is "
                             f"read from /server_info ({shown or 'which says none of it'})")
    unsaid = [s for s in served.settings if s.source == "command"]
    if contradictions := served.contradictions:
        _fail(f"{service.label} does not serve what its command sets: " + "; ".join(contradictions)
              + " (it was not started from the profile's command: a stale or edited unit, a server started "
              "by hand, or a proxy in front of another server; the checks judge what /server_info says)")
    if unsaid:
        skips.could_not_check(f"{service.label}: /server_info does not say "
                              + ", ".join(s.key for s in unsaid)
                              + " (SGLang 0.5.17's does): its command's "
                              + ", ".join(f"{s.flag} {s.command}" for s in unsaid) + " could not be compared")
    return served


__all__ = ["STAY_UP_S", "has_not_restarted", "health_answers", "model_problems", "ready_by_real_generation",
           "served_models", "serves_one_consistent_model", "serves_the_commands_configuration",
           "serves_the_profiles_algorithm", "serves_the_profiles_speculation", "stays_up"]
