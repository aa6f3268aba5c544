"""One root cause, one diagnosis (issue 41): the catalog's entries that describe the same event fold into the most
specific one, cause before consequence (never alphabetical), with a remedy that fits how the service is run; read
against real recorded logs and the refserver's own lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_dflash.evidence.diagnosis import default_catalog, diagnose, load_catalog

DDTREE_RUNS = Path(__file__).parents[1] / "data" / "sglang-0.5.17-h200-ddtree"
KILLED_RANK = ("[2026-12-06 09:58:31] Subprocess scheduler_1 (pid=25192) crashed with exit code -9. Triggering "
               "SIGQUIT for cleanup...\n[2026-12-06 09:58:31] SIGQUIT received. signum=None, frame=None. It usually "
               "means one child failed.\n")
DROPPED = "ApiError: tp/dflash /generate: no HTTP response: connection dropped: Server disconnected"


def test_a_killed_rank_is_one_diagnosis_not_three() -> None:
    """Today: [sglang-subprocess-sigkilled], [scheduler-crash], [connection-dropped] for one SIGKILLed rank."""
    crash = "Scheduler hit an exception: Traceback (most recent call last):\nRuntimeError: x\n"
    raw = [sig.id for sig, _ in default_catalog().matches(DROPPED, KILLED_RANK + crash)]
    assert {"sglang-subprocess-sigkilled", "scheduler-crash", "connection-dropped"} <= set(raw)
    (found,) = diagnose(DROPPED, KILLED_RANK + crash)
    assert found.id == "sglang-subprocess-sigkilled"
    assert set(found.folded) == {"scheduler-crash", "connection-dropped"}
    assert found.as_dict()["folded"] == ", ".join(found.folded)


def test_the_cause_comes_before_its_consequences_whatever_their_names() -> None:
    """The seed's SM 12.x toolkit line, its misleading sm75 line, the crash and the dropped request: the toolkit
    leads (alphabetically, connection-dropped would)."""
    text = ("Failed to get device capability: SM 12.x requires CUDA >= 12.9.\n"
            "RuntimeError: FlashInfer requires GPUs with sm75 or higher\n"
            "Scheduler hit an exception: Traceback (most recent call last):\n"
            "  File \"sampling.py\", line 23, in top_k_top_p_sampling_from_probs\n"
            "    return get_sampling_module().top_k_top_p_sampling_from_probs(\n" + DROPPED)
    found = diagnose(text)
    assert [d.id for d in found] == ["flashinfer-sm12x-nvcc"]
    assert found[0].folded == ("flashinfer-no-eligible-arch", "sampling-jit-first-sampled-request",
                               "scheduler-crash", "connection-dropped")


def test_a_native_crash_of_a_subprocess_keeps_its_own_name_and_folds_the_crash_lines() -> None:
    log = (DDTREE_RUNS / "run4-stack-sampler-crash" / "server_plain_acc.log").read_text()
    found = diagnose(log, "the test passed but service h200/plain_acc died: killed by SIGKILL")
    assert [d.id for d in found] == ["sglang-subprocess-died"]


def test_two_causes_stay_two_diagnoses_in_priority_order() -> None:
    text = ("No module named 'soundfile'\nNVRM: Xid (PCI:0000:19:00): 79, GPU has fallen off the bus\n"
            "Scheduler hit an exception")
    found = diagnose(text)
    assert [d.id for d in found] == ["gpu-fallen-off-bus", "soundfile-missing", "gpu-xid"]
    assert found[0].folded == ("scheduler-crash",)


@pytest.mark.parametrize(("mode", "says", "never"), [
    ("", "run the kernels layer", "--attach-log-command"),
    ("provisioned", "run the kernels layer", "--attach-log-command"),
    ("attach", "--attach-log-command", "run the kernels layer"),
])
def test_a_remedy_fits_the_mode(mode: str, says: str, never: str) -> None:
    """Attached by URL, nothing can run the kernels layer: the remedy says what can be done from there."""
    seen = "first sampled generation (POST /generate) killed it: no HTTP response (connection dropped)"
    (found,) = diagnose(seen, symptoms=seen, mode=mode)
    assert found.id == "sampling-jit-first-sampled-request"
    assert says in found.remedy and never not in found.remedy


def test_a_container_remedy_asks_for_the_image_and_a_provisioned_one_for_the_profile() -> None:
    line = "Failed to get device capability: SM 12.x requires CUDA >= 12.9."
    assert "build the image" in diagnose(line, mode="container")[0].remedy
    assert "point CUDA_HOME" in diagnose(line, mode="provisioned")[0].remedy
    bad = "ValueError: Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set but they differ"
    assert diagnose(bad)[0].remedy.startswith("fix the unit's ExecStart")
    assert diagnose(bad, mode="provisioned")[0].remedy.startswith("fix the service's command in its profile")


def test_a_stopped_rank_folds_the_stuck_engine_into_itself() -> None:
    stuck = ("service tp/dflash is stuck: POST /generate not answered within 20s (--request-timeout, total time): "
             "got no output; the engine makes no progress at all; tensor-parallel rank TP1 (rank 1, pid 102, GPU 5) "
             "stopped while serving: SIGSTOP or a debugger (process state T)")
    (found,) = diagnose(stuck)
    assert found.id == "tp-rank-stopped" and found.folded == ("engine-stuck",)


def test_headline_is_the_diagnosis_and_its_remedy_on_one_line() -> None:
    (found,) = diagnose(KILLED_RANK)
    line = found.headline()
    assert "\n" not in line and line.startswith("[sglang-subprocess-sigkilled] ")
    assert " — remedy: " in line and found.remedy in line


def test_catalog_rejects_folds_of_unknown_ids(tmp_path: Path) -> None:
    bad = tmp_path / "c.toml"
    bad.write_text('[[signature]]\nid = "a"\ntitle = "t"\nany = ["x"]\nfolds = ["nope"]\n')
    with pytest.raises(ValueError, match="folds unknown ids"):
        load_catalog(bad)
