"""A reasoning model still thinking when max_tokens cut it (--reasoning-parser: SGLang's ReasonerGrammarBackend
applies a chat's grammar, and a forced call's, only after the think-end): the constrained answer was never
given, so the structured and forced-call checks could not check it. Before, both said the answer had "no output
at all" / "no tool call at all" although reasoning_content held max_tokens tokens of it: a false failure of a
healthy reasoning model, in the wrong words (issue 39, Deliver 6)."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_dflash.client.answers import Answer, whole_answer
from pytest_dflash.layers.generation.chat_surface import check_tool_calls
from pytest_dflash.layers.generation.structured import GRAMMARS, check_outcome


def chat(message: dict[str, Any], reason: str, tokens: int) -> Answer:
    """A whole chat answer as SGLang sends it, read by the client."""
    return whole_answer({"choices": [{"index": 0, "message": {"role": "assistant", **message},
                                      "finish_reason": reason}],
                         "usage": {"completion_tokens": tokens}}, "chat", "svc")


THINKING = {"reasoning_content": "Okay, the user wants a person. Let me think about names" * 3, "content": ""}


@pytest.mark.parametrize("grammar", ["response_format", "json_object"])
def test_a_constrained_chat_still_reasoning_at_max_tokens_could_not_be_checked(grammar: str) -> None:
    with pytest.raises(pytest.skip.Exception, match=r"could not check: svc: still reasoning when max_tokens=160 "
                                                    r"cut the output"):
        check_outcome(chat(THINKING, "length", 160), GRAMMARS[grammar], what="svc", max_tokens=160)


def test_a_forced_call_still_reasoning_at_max_tokens_could_not_be_checked() -> None:
    with pytest.raises(pytest.skip.Exception, match=r"could not check: svc: still reasoning when max_tokens=200 "
                                                    r"cut the output"):
        check_tool_calls(chat({**THINKING, "tool_calls": None}, "length", 200), None, what="svc", max_tokens=200)


def test_without_reasoning_the_same_cut_still_fails() -> None:
    """No reasoning, no content, no call: the length finish is still no output at all, and a lie about the count
    still fails with reasoning."""
    with pytest.raises(AssertionError, match="no output at all"):
        check_outcome(chat({"content": ""}, "length", 160), GRAMMARS["response_format"], what="svc", max_tokens=160)
    with pytest.raises(AssertionError, match="cut by max_tokens=200 .* neither a tool call nor content"):
        check_tool_calls(chat({"content": "", "tool_calls": None}, "length", 200), None, what="svc", max_tokens=200)
    with pytest.raises(AssertionError, match="after 12 of max_tokens=160"):
        check_outcome(chat(THINKING, "length", 12), GRAMMARS["response_format"], what="svc", max_tokens=160)
    with pytest.raises(AssertionError, match="after 12 of max_tokens=200"):
        check_tool_calls(chat({**THINKING, "tool_calls": None}, "length", 12), None, what="svc", max_tokens=200)


def test_a_chat_to_a_reasoning_model_gets_room_to_think() -> None:
    """Deliver 6: a served reasoning parser gives a chat (constrained or forced call) THINKING_ROOM more
    max_tokens; /generate and a model without one keep the check's own limit."""
    from pytest_dflash.client.sampling import Sampling
    from pytest_dflash.layers.generation.structured import THINKING_ROOM, room_to_think

    base = Sampling(max_tokens=160, temperature=0.8, seed=11)
    assert room_to_think(base, "chat", "qwen3") == Sampling(max_tokens=160 + THINKING_ROOM, temperature=0.8, seed=11)
    assert room_to_think(base, "chat", None) == base
    assert room_to_think(base, "generate", "qwen3") == base
