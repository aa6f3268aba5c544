"""A service whose profile says structured_output = false must refuse a constrained request, or serve it right.
SGLang 0.5.17 refuses a streamed /generate in the stream: `finish_reason {"type": "abort", "status_code": 400,
"message": "Grammar-based generation ... --grammar-backend none"}` (tests/data/sglang-0.5.17-h100-structured,
nogrammar.json). Before, any abort passed as that refusal: an abort with status 500 (the grammar's
"accept_token failed" under speculation, a scheduler's abort) is no refusal of the request, and it failed no
check (issue 39: no check passes on evidence it did not get)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_dflash.client.answers import streamed_answer
from pytest_dflash.layers.generation.structured import GRAMMARS, unserved_problem

RECORDED = Path(__file__).parents[2] / "data" / "sglang-0.5.17-h100-structured" / "nogrammar.json"


def recorded_refusal() -> list[dict[str, Any]]:
    """The events of the first streamed /generate refusal real SGLang sent under --grammar-backend none."""
    for entry in json.loads(RECORDED.read_text())["answers"]:
        answer = entry.get("answer")
        if isinstance(answer, str) and '"type":"abort"' in answer:
            return [json.loads(line[6:]) for line in answer.splitlines()
                    if line.startswith("data: {")]
    raise AssertionError("no recorded abort")


def test_the_recorded_abort_with_status_400_is_a_refusal() -> None:
    events = recorded_refusal()
    assert events[-1]["meta_info"]["finish_reason"]["status_code"] == 400
    answer = streamed_answer(events, "generate", done=True)
    assert answer.finish_reason == "abort" and answer.finish_status == 400
    assert unserved_problem(answer, GRAMMARS["json_schema"], 160) is None


@pytest.mark.parametrize("status", [500, None])
def test_an_abort_that_is_no_400_is_no_refusal(status: int | None) -> None:
    events = recorded_refusal()
    finish = {"type": "abort", "message": "Grammar accept_token failed", "status_code": status}
    events[-1] = {**events[-1], "meta_info": {**events[-1]["meta_info"], "finish_reason": finish}}
    problem = unserved_problem(streamed_answer(events, "generate", done=True), GRAMMARS["json_schema"], 160)
    assert problem is not None and f"an abort with status {status!r}" in problem, problem
    assert "Grammar accept_token failed" in problem and "no refusal of the request" in problem


def test_a_refusal_fails_a_service_whose_profile_says_it_serves_structured_output() -> None:
    """The converse (structured_output = true): SGLang's in-stream refusals, the chat error event with code 400
    and the /generate abort with status 400, are failures of a service that should serve the grammar."""
    from pytest_dflash.layers.generation.structured import check_outcome

    event = {"error": {"message": "grammar refused", "type": "BadRequestError", "code": 400}}
    chat = streamed_answer([], "chat", done=True, error=event)  # the client hands the error event over apart
    with pytest.raises(AssertionError, match=r"svc: an error event inside the stream \(code 400\): grammar refused"):
        check_outcome(chat, GRAMMARS["response_format"], what="svc", max_tokens=160)
    with pytest.raises(AssertionError, match=r"svc: finish_reason 'abort' \(Grammar-based generation"):
        check_outcome(streamed_answer(recorded_refusal(), "generate", done=True), GRAMMARS["json_schema"],
                      what="svc", max_tokens=160)
