"""Which model a server serves, as each endpoint says it: real SGLang 0.5.17 answers (recorded on the H200)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_dflash.layers.service.checks import model_problems

DATA = Path(__file__).parents[2] / "data" / "sglang-0.5.17-h200"


def _said() -> dict[str, Any]:
    """What the recorded DFLASH server (CUDA graphs on) said: responses.json; server_info from the same run."""
    calls = json.loads((DATA / "responses.json").read_text())
    info = json.loads((DATA / "server_info_dflash_graph.json").read_text())
    return {"/v1/models": [m["id"] for m in calls["dflash/v1_models"]["body_json"]["data"]],
            "/model_info model_path": calls["dflash/model_info"]["body_json"]["model_path"],
            "/server_info model_path": info["model_path"],
            "/server_info served_model_name": info.get("served_model_name")}


def test_the_recorded_server_agrees_with_itself_and_its_model() -> None:
    said = _said()
    assert model_problems(said, None) == []
    assert model_problems(said, "/tmp/models/target") == []


def test_a_profile_naming_another_model_is_a_problem() -> None:
    problems = model_problems(_said(), "Qwen/Qwen3-8B")
    assert problems == ["the profile's model 'Qwen/Qwen3-8B' is none of what the server names: ['/tmp/models/target']"]


def test_endpoints_that_disagree_are_named() -> None:
    said = _said()
    said["/model_info model_path"] = "/models/other"
    said["/v1/models"] = ["something-else"]
    problems = model_problems(said, None)
    assert any("different model paths" in p for p in problems)
    assert any("/v1/models lists ['something-else']" in p for p in problems)
