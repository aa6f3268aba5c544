"""The diagnosis catalog against real SGLang 0.5.17 logs recorded on an H200 (tests/data), and the lines of later
releases as their wheels write them (tests/data/sglang-versions)."""

from __future__ import annotations

import argparse
import contextlib
import io
import tomllib
from pathlib import Path

import pytest

from pytest_dflash.evidence.diagnosis import default_catalog, diagnose, load_catalog
from pytest_dflash.layers.gpu.flags import REMOVED_FLAGS
from pytest_dflash.services.stuck import ServiceStuck

LOGS = Path(__file__).parents[1] / "data" / "sglang-0.5.17-h200" / "logs"


def ids(text: str) -> list[str]:
    return [d.id for d in diagnose(text)]


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        ("S1_no_soundfile.log", "soundfile-missing"),
        ("S2a_no_StructuralTag_grammar_none.log", "xgrammar-structural-tag"),
        ("S2b_no_StructuralTag_default_grammar.log", "xgrammar-structural-tag"),
        # the cause (a stray NVCC flag), not its consequence (the first sampled request died), comes first
        ("S3a_sampling_jit_nvcc_bad_flag.log", "nvcc-rejects-flags"),
        ("S3b_sampling_jit_no_curand_headers.log", "curand-header-missing"),
        ("S4a_frac_0.99_other_process_holds_gpu.log", "cuda-oom-startup"),
        ("S4b_gpu_full_0.25GiB_free.log", "cuda-oom-startup"),
        ("S4c_context_length_1e9_no_override.log", "context-length-too-long"),
        ("S4d_context_length_1e9_override.log", "cuda-oom-startup"),
        ("S4e_neighbour_allocates_during_startup.log", "kv-cache-no-memory"),
    ],
)
def test_recorded_failure_gets_its_primary_diagnosis(log: str, expected: str) -> None:
    found = ids((LOGS / log).read_text(errors="replace"))
    assert found and found[0] == expected, found


@pytest.mark.parametrize("log", ["server_dflash_nograph.log", "server_dflash_graph.log", "server_plain.log",
                                 "W_warm_plain.log"])
def test_healthy_server_logs_trigger_nothing(log: str) -> None:
    """Benign lines (deprecations, RLIMIT, SIGTERM shutdown's SIGQUIT) must not be diagnosed."""
    assert ids((LOGS / log).read_text(errors="replace")) == []


def test_broken_launches_from_fail_modes_log() -> None:
    text = (LOGS / "fail_modes.log").read_text(errors="replace")
    cases = {chunk.split(":", 1)[0].strip(): chunk for chunk in text.split("################ CASE")[1:]}
    assert ids(cases["block_conflict"])[0] == "bad-server-arguments"
    assert ids(cases["no_draft_path"])[0] == "bad-server-arguments"
    assert ids(cases["mask_oob"])[0] == "dflash-draft-mismatch"
    assert ids(cases["fc_mismatch"])[0] == "dflash-draft-mismatch"
    assert ids(cases["draft_missing_dir"])[0] == "model-path-missing"
    assert ids(cases["rejection"]) == []  # started fine: silently accepted flag


def test_seed_004_journal_excerpt_matches_on_function_names_not_line_numbers() -> None:
    # Verbatim from seed 004 (flashinfer line numbers 1558/54, not 0.6.15's 1729/68).
    journal = (
        'May 25 20:27:22 dflash-train python[71283]:   File "/root/venv_sglang211/lib/python3.12/site-packages/'
        'flashinfer/sampling.py", line 1558, in top_k_top_p_sampling_from_probs\n'
        "May 25 20:27:22 dflash-train python[71283]:     return get_sampling_module().top_k_top_p_sampling_from_probs(\n"
        "May 25 20:27:22 dflash-train python[71283]:            ^^^^^^^^^^^^^^^^^^^^^\n"
        'May 25 20:27:22 dflash-train python[71283]:   File "/root/venv_sglang211/lib/python3.12/site-packages/'
        'flashinfer/sampling.py", line 54, in g...\n'
    )
    assert ids(journal)[0] == "sampling-jit-first-sampled-request"


def test_sm120_messages_name_the_toolkit() -> None:
    text = ("Failed to get device capability: SM 12.x requires CUDA >= 12.9.\n"
            "RuntimeError: FlashInfer requires GPUs with sm75 or higher")
    found = diagnose(text, values={"python": "/root/venv/bin/python"})
    assert found[0].id == "flashinfer-sm12x-nvcc"
    assert "12.9" in found[0].remedy


def test_oom_guess_only_without_a_traceback() -> None:
    assert ids("service x died: killed by SIGKILL")[0] == "killed-sigkill-oom"
    crash = "Scheduler hit an exception: Traceback (most recent call last):\nkilled by SIGKILL"
    assert "killed-sigkill-oom" not in ids(crash)


DDTREE_RUNS = Path(__file__).parents[1] / "data" / "sglang-0.5.17-h200-ddtree"


@pytest.mark.parametrize("service", ["plain_acc", "ddtree_acc_overlap"])
def test_a_scheduler_segfault_is_named_not_guessed_as_oom(service: str) -> None:
    """Run 4: scheduler_0 died of SIGSEGV and SGLang SIGKILLed its own tree. The server's log says so; the
    verdict of that run guessed the OOM killer because the failing test's window held none of these lines."""
    log = (DDTREE_RUNS / "run4-stack-sampler-crash" / f"server_{service}.log").read_text()
    found = diagnose(log, f"the test passed but service h200/{service} died: killed by SIGKILL")
    assert [d.id for d in found] == ["sglang-subprocess-died"]
    assert "crashed with exit code -11" in found[0].evidence


def test_a_scheduler_killed_by_sigkill_points_at_the_oom_killer() -> None:
    """Exit code -9 in SGLang's watchdog line: the kernel took the child (or an operator did), not a native crash."""
    log = (DDTREE_RUNS / "run4-stack-sampler-crash" / "server_plain_acc.log").read_text()
    killed = log.replace("crashed with exit code -11", "crashed with exit code -9")
    assert "crashed with exit code -9" in killed
    assert ids(killed) == ["sglang-subprocess-sigkilled"]


@pytest.mark.parametrize("service", ["ddtree_acc_graphs", "dflash_acc_prod"])
def test_a_sigterm_shutdown_that_logs_exit_code_minus_15_is_no_crash(service: str) -> None:
    """The same run's healthy servers, stopped by the plugin: SGLang's watchdog logs "crashed with exit code -15"."""
    log = (DDTREE_RUNS / "run4-stack-sampler-crash" / f"server_{service}.log").read_text()
    assert "crashed with exit code -15" in log
    assert ids(log) == []


def test_remedy_placeholders_are_filled() -> None:
    found = diagnose("ModuleNotFoundError: No module named 'soundfile'", values={"python": "/opt/v/bin/python"})
    assert "/opt/v/bin/python -m pip install soundfile" in found[0].remedy


def test_catalog_rejects_unknown_keys_and_duplicates(tmp_path: Path) -> None:
    bad = tmp_path / "c.toml"
    bad.write_text('[[signature]]\nid = "a"\ntitle = "t"\nany = ["x"]\nanyy = ["y"]\n')
    with pytest.raises(ValueError, match="unknown keys"):
        load_catalog(bad)
    bad.write_text('[[signature]]\nid = "a"\ntitle = "t"\nany = ["x"]\n[[signature]]\nid = "a"\ntitle = "u"\nany = ["y"]\n')
    with pytest.raises(ValueError, match="duplicate id"):
        load_catalog(bad)


def test_every_signature_has_a_title_remedy_and_layer() -> None:
    for sig in default_catalog().signatures:
        assert sig.title and sig.remedy and sig.layer, sig.id


# ---- releases after 0.5.17 (tests/data/sglang-versions: read from the 0.5.17-0.5.23 wheels) -----------------------

VERSIONS = Path(__file__).parents[1] / "data" / "sglang-versions"
LOG_LINES = tomllib.loads((VERSIONS / "log-lines.toml").read_text(encoding="utf-8"))["line"]


@pytest.mark.parametrize("line", LOG_LINES, ids=lambda line: f"{line['release']}-{line['diagnosis'] or 'nothing'}")
def test_log_lines_of_later_releases(line: dict[str, str]) -> None:
    found = ids(line["text"])
    assert found[:1] == ([line["diagnosis"]] if line["diagnosis"] else []), (line["source"], found)


def unrecognized(*argv: str) -> str:
    """What SGLang's parser (prepare_server_args: parser.parse_args) writes for a flag it lacks: argparse's error."""
    parser = argparse.ArgumentParser(prog="launch_server.py")
    parser.add_argument("--model-path")
    with contextlib.redirect_stderr(io.StringIO()) as err, pytest.raises(SystemExit):
        parser.parse_args(["--model-path", "/m", *argv])
    return err.getvalue()


@pytest.mark.parametrize("flag", [r.flag for r in REMOVED_FLAGS])
def test_every_removed_flag_rejected_by_argparse_is_named(flag: str) -> None:
    text = unrecognized(flag, "1")
    assert f"launch_server.py: error: unrecognized arguments: {flag} 1" in text
    assert ids(text)[:2] == ["sglang-flag-removed", "bad-server-arguments"]


@pytest.mark.parametrize("flag", ["--speculative-draft-window-size", "--cuda-graph-bs-decode", "--cuda-graph-max-bs-x",
                                  "--stream-output-x", "--this-flag-does-not-exist"])
def test_an_unknown_flag_that_no_release_removed_stays_bad_server_arguments(flag: str) -> None:
    assert ids(unrecognized(flag, "1")) == ["bad-server-arguments"]


@pytest.mark.parametrize(("not_ready", "expected"), [("paused", "engine-paused"),
                                                     ("paused or unhealthy", "engine-paused"),
                                                     ("", "engine-stuck")])
def test_a_paused_server_is_diagnosed_paused_not_stuck(not_ready: str, expected: str) -> None:
    """ServiceStuck's own message (services/stuck.py) for a request lost to a paused server (GET /ready 503) and to
    a wedged one: only the wedge is engine-stuck."""
    stuck = ServiceStuck("h/dflash", 3.0, "POST /generate timed out", request="POST /generate", got="nothing",
                         progress="the engine makes no progress at all (GET /ready: 503 ...)", moving=False,
                         not_ready=not_ready)
    assert ids(str(stuck))[:1] == [expected], str(stuck)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Grammar-based generation (json_schema, regex, ebnf, structural_tag) is not supported when the server "
         "is launched with --grammar-backend none", "grammar-backend-none"),
        ("off: its command has `--grammar-backend none`: every constrained request", "grammar-backend-none"),
        ("finish_reason 'abort' (Grammar accept_token failed with token 116 (grammar json))", "grammar-accept-failed"),
    ],
)
def test_structured_output_failures_are_named(text: str, expected: str) -> None:
    assert ids(text)[0] == expected


def test_symptoms_diagnose_only_when_no_log_was_read_and_say_what_is_missing() -> None:
    """What was seen over HTTP names the catalog entry when there is no log; with the log's own line it is
    not needed, and the text alone (as a log) never matches a symptom."""
    seen = ("ServiceGone: service attached is gone during readiness: first sampled generation (temperature 0.8): "
            "POST /generate killed it: no HTTP response (connection dropped), then connections refused")
    assert "sampling-jit-first-sampled-request" not in ids(seen)
    (found, *_) = diagnose(seen, symptoms=seen, missing="no service log was read")
    assert found.id == "sampling-jit-first-sampled-request"
    assert found.evidence.startswith("seen over HTTP: ServiceGone:") and found.missing == "no service log was read"
    assert found.as_dict()["missing"] == "no service log was read"
    # the same death when the liveness probe saw the refusal before the client saw the drop (a race under load)
    raced = ("ServiceGone: service attached is gone during readiness: first sampled generation (temperature 0.8): "
             "POST /generate killed it: connections refused while it was in flight")
    assert diagnose(raced, symptoms=raced, missing="m")[0].id == "sampling-jit-first-sampled-request"
    assert "missing" not in diagnose("accept len: 1.00, accept rate: 0.00\nno speculation in practice")[0].as_dict()
    zero = "AssertionError: h/dflash: no speculation in practice: accept length 1.016 (accept rate 0.000) < 1.1"
    assert [d.id for d in diagnose(zero, symptoms=zero, missing="m")] == ["draft-never-accepted"]
    assert diagnose("no speculation in practice: accept length 1.4 (accept rate 0.400)",
                    symptoms="no speculation in practice: accept length 1.4 (accept rate 0.400)") == []
