"""Real prompts through the real plugin and suites against a refserver: the accept length per category of the shipped
prompt set (parity layer) and of a `[perf] dataset` run (perf layer) reach the verdict and the terminal summary."""

from __future__ import annotations

import json
from pathlib import Path

from e2e_helpers import write_profile
from support.pytest_runs import assert_no_crash, verdict

CATEGORIES = {"chat", "code", "math", "summarisation", "multilingual"}


def test_accept_length_per_category_in_the_verdict_and_summary(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sets = tmp_path / "sets"
    sets.mkdir()
    rows = [("code", "def add(a, b):\n    return"), ("code", "for i in range(10):"),
            ("math", "Compute 12 * 12 and explain."), ("chat", "What should I cook tonight?")]
    (sets / "mine.jsonl").write_text("".join(json.dumps({"category": c, "prompt": p}) + "\n" for c, p in rows))
    perf = ('\n[perf]\nendpoint = "generate"\nconcurrency = 2\nrequests = 24\nwarmup = 0\noutput_len = 16\n'
            'max_loop_lag_ms = 1000\nmax_client_cpu = 100\ndataset = "sets/mine.jsonl"\n')
    profile = write_profile(tmp_path, "prompts", {"dflash": ("DFLASH", [])}, extra=perf)
    result = run_suite(["parity", "perf"], "--host", str(profile), "-k", "test_accept_length")
    assert_no_crash(result)
    result.assert_outcomes(passed=2)
    data = verdict(run_suite.reports, "prompts")
    metrics = data["metrics"]
    # parity layer: a seeded sample of the shipped set, a few prompts per category
    fact = metrics["acceptance:dflash"]
    assert fact["source"] == "meta_info" and fact["prompts"] == len(fact["per_request"]) <= 20
    assert set(fact["per_category"]) == CATEGORIES and set(fact["prompts_per_category"]) == CATEGORIES
    assert all(v >= 1.0 for v in fact["per_category"].values()), fact
    assert sum(fact["prompts_per_category"].values()) == fact["prompts"]
    # perf layer: the per-request accept lengths of the dataset run, grouped by its categories
    by_category = {k.rsplit(".", 1)[1]: v for k, v in metrics.items() if k.startswith("perf.dflash.accept_length_by_category.")}
    assert set(by_category) == {"chat", "code", "math"} and all(v >= 1.0 for v in by_category.values()), metrics
    perf_doc = json.loads((run_suite.reports / "perf" / "prompts" / "dflash.json").read_text())
    assert perf_doc["spec"]["dataset"] == str((sets / "mine.jsonl").resolve())
    assert {r["prompt_len"] for r in perf_doc["requests"]} == {len(p.split()) for _, p in rows}
    result.stdout.fnmatch_lines([
        "*dflash verdict*",
        "*note: dflash: accept length per category (16 greedy prompts, * tokens each): chat *, code *, math *, "
        "multilingual *, summarisation *",
    ])
    result.stdout.fnmatch_lines(["*dflash perf*", "prompts: generate, concurrency 2, prompts of mine.jsonl + 16 "
                                 "tokens, 24 requests", "*dflash (DFLASH): *per category chat *, code *, math *"])
