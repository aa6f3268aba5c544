"""The served speculation against the profile's command and SGLang's warnings, on real text: logs and /server_info
recorded on the H200, the device profiles that started them, and SGLang 0.5.17's own warning strings."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from pytest_dflash.services.speculation import (
    LOG_RULES,
    compare,
    log_findings,
    requested_speculation,
    served_speculation,
    server_args_from_log,
)

DATA = Path(__file__).parents[1] / "data"
RUN = DATA / "sglang-0.5.17-h200-2026-12-02"
WARNINGS = (DATA / "sglang-0.5.17-source" / "speculative_warnings.log").read_text()
TOOLS = Path(__file__).parents[2] / "tools" / "device"


def _command(profile: Path, service: str) -> list[str]:
    data: dict[str, Any] = tomllib.loads(profile.read_text())
    command: list[str] = data["services"][service]["command"]
    return command


def test_the_real_ngram_service_served_what_its_profile_asked() -> None:
    """h200-ngram.toml asked NGRAM with 8 draft tokens; the server's own server_args line says it served that.
    SGLang reset max_running_requests to 48 and set topk to the BFS breadth (10): notes, not failures."""
    log = (RUN / "ngram.server.log").read_text()
    asked = requested_speculation(_command(RUN / "h200-ngram.toml", "ngram"))
    assert asked == {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 8,
                     "attention_backend": "triton"}
    served = server_args_from_log(log)
    assert served["speculative_eagle_topk"] == 10 and served["max_running_requests"] == 48
    findings = compare(asked, served, log, algorithm="NGRAM")
    assert findings.failures == []
    assert len(findings.notes) == 1 and findings.notes[0].endswith("; served 48")


def test_the_real_random_draft_dflash_service_serves_its_profiles_speculation() -> None:
    """tools/device/h200.toml's DFLASH service: no block size asked (16 from the draft config), nothing overridden
    but max_running_requests; the served configuration is recorded."""
    log = (RUN / "h200.dflash.server.log").read_text()
    served = server_args_from_log(log)
    assert served == {"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 16,
                      "speculative_num_steps": 1, "speculative_eagle_topk": 1,
                      "speculative_draft_attention_backend": "triton", "attention_backend": "triton",
                      "max_running_requests": 48, "disable_overlap_schedule": False,
                      "speculative_draft_model_path": "/tmp/models/draft", "speculative_use_rejection_sampling": False}
    findings = compare(requested_speculation(_command(TOOLS / "h200.toml", "dflash")), served, log,
                       algorithm="DFLASH")
    assert findings.failures == [] and [n.split(";")[0] for n in findings.notes] == [
        "max_running_requests was reset for speculative decoding (set --max-running-requests to choose it)"]
    # short: the value, not the whole log line with its timestamp on every DFLASH host
    assert findings.notes[0].endswith("; served 48") and "the log says" not in findings.notes[0]


def test_a_served_block_size_other_than_asked_fails() -> None:
    """The real DFLASH server of run 4 served 16 draft tokens; a command asking 8 is not what ran."""
    log = (DATA / "sglang-0.5.17-h200-ddtree" / "run4-accept" / "server_dflash_acc.log").read_text()
    findings = compare({"speculative_num_draft_tokens": 8}, server_args_from_log(log), log, algorithm="DFLASH")
    assert findings.failures == ["--speculative-num-draft-tokens 8 asked, /server_info speculative_num_draft_tokens "
                                 "= 16"]


def test_a_recorded_server_info_of_another_algorithm_fails() -> None:
    info = json.loads((DATA / "sglang-0.5.17-h200" / "server_info_dflash_graph.json").read_text())
    served = served_speculation(info)
    assert served["speculative_algorithm"] == "DFLASH"
    assert compare({}, served, algorithm="DFLASH").failures == []
    assert compare({}, served, algorithm="DDTREE").failures == [
        "--speculative-algorithm DDTREE asked, /server_info speculative_algorithm = 'DFLASH'"]
    assert served_speculation({**info, "speculative_algorithm": None}) == {}


def test_every_sglang_warning_is_recognised_and_only_the_greedy_fallback_fails() -> None:
    found = log_findings(WARNINGS)
    assert [rule.name for rule, _ in found] == [rule.name for rule in LOG_RULES]
    failing = [line for rule, line in found if rule.fails]
    assert failing == ["[2026-12-03 00:00:09] DFLASH non-greedy verification is unavailable on this build/device; "
                       "falling back to greedy argmax verification."]
    findings = compare({}, {"speculative_algorithm": "DFLASH"}, WARNINGS, algorithm="DFLASH")
    assert len(findings.failures) == 1 and len(findings.notes) == len(LOG_RULES) - 1
    assert "overriding speculative_num_steps=3 to 1" in " ".join(findings.notes)
    assert "but got 'flashmla'. Falling back to 'flashinfer'" in " ".join(findings.notes)


def test_eagle_topk_one_adjusting_the_draft_tokens_is_a_note() -> None:
    """SGLang's rule (EAGLE, topk 1): num_draft_tokens := num_steps + 1, with its warning: a note, not a failure."""
    asked = requested_speculation(["--speculative-algorithm=eagle3", "--speculative-num-steps", "3",
                                   "--speculative-num-draft-tokens", "8", "--disable-overlap-schedule"])
    assert asked == {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3,
                     "speculative_num_draft_tokens": 8, "disable_overlap_schedule": True}
    served = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
              "speculative_num_draft_tokens": 4}
    adjusted = next(line for line in WARNINGS.splitlines() if "is adjusted to" in line)
    findings = compare(asked, served, adjusted, algorithm="EAGLE3")
    assert findings.failures == []
    assert findings.notes[0] == ("--speculative-num-draft-tokens 8 asked, /server_info speculative_num_draft_tokens = "
                                 "4 (topk 1: SGLang uses num_steps + 1)")


def test_perf_concurrency_above_the_served_max_running_requests_is_a_note() -> None:
    """tools/device/h200.toml's [perf] concurrency 4 fits the reset 48; a concurrency of 64 would queue."""
    log = (RUN / "h200.dflash.server.log").read_text()
    served = server_args_from_log(log)
    perf = tomllib.loads((TOOLS / "h200.toml").read_text())["perf"]
    assert not any("[perf]" in n for n in compare({}, served, algorithm="DFLASH",
                                                  perf_concurrency=perf["concurrency"]).notes)
    notes = compare({}, served, algorithm="DFLASH", perf_concurrency=64).notes
    assert notes == ["[perf] concurrency 64 > the served max_running_requests 48: the perf layer's requests queue "
                     "on the server"]


def _recorded_services() -> list[tuple[str, str, dict[str, Any], str]]:
    """(run, service, its profile table, its log) for every server the DDTree H200 runs recorded with a
    server_args line (a server that crashed before logging one has nothing to compare)."""
    found = []
    for run in sorted((DATA / "sglang-0.5.17-h200-ddtree").iterdir()):
        for profile in run.glob("*.toml"):
            data = tomllib.loads(profile.read_text())
            for name, table in data["services"].items():
                log = run / f"server_{name}.log"
                if log.is_file() and "server_args=ServerArgs(" in (text := log.read_text(errors="replace")):
                    found.append((run.name, name, {**table, "perf": data.get("perf", {})}, text))
    return found


def test_every_recorded_h200_server_served_what_its_profile_asked() -> None:
    """No false alarm on 50-odd real servers (plain, DFLASH, DDTREE; graphs, overlap, flashinfer, budgets 8-64):
    each speculative one gets exactly SGLang's max_running_requests note, a plain one nothing."""
    recorded = _recorded_services()
    assert len(recorded) >= 40
    for run, name, table, log in recorded:
        findings = compare(requested_speculation(table["command"]), server_args_from_log(log), log,
                           algorithm=table["algorithm"].upper(), perf_concurrency=table["perf"].get("concurrency"))
        assert findings.failures == [], (run, name, findings.failures)
        expected = 0 if table["algorithm"].upper() == "NONE" else 1
        assert len(findings.notes) == expected, (run, name, findings.notes)


def test_disaggregation_is_recorded_and_noted() -> None:
    """The real server_args line says disaggregation_mode='null' (not recorded); a decode server of a PD pair (the
    same line with SGLang's 'decode') is recorded and noted: DFlash has run without speculation there upstream."""
    log = (RUN / "h200.dflash.server.log").read_text()
    assert "disaggregation_mode='null'" in log and "disaggregation_mode" not in server_args_from_log(log)
    decode = server_args_from_log(log.replace("disaggregation_mode='null'", "disaggregation_mode='decode'"))
    assert decode["disaggregation_mode"] == "decode"
    findings = compare({}, decode, algorithm="DFLASH")
    assert findings.failures == [] and findings.notes[0].startswith(
        "served under prefill/decode disaggregation (disaggregation_mode = 'decode')")


def test_overlap_scheduling_asked_off_and_served_on_is_a_note() -> None:
    """The real DFLASH server ran with the overlap scheduler (disable_overlap_schedule=False in its server_args)."""
    log = (RUN / "h200.dflash.server.log").read_text()
    findings = compare(requested_speculation(["--disable-overlap-schedule"]), server_args_from_log(log),
                       algorithm="DFLASH")
    assert findings.failures == []
    assert findings.notes == ["--disable-overlap-schedule asked, /server_info disable_overlap_schedule = False"]
