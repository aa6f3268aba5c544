"""SGLang 0.5.17 behaviours a real run on the H200 showed, which the refserver must reproduce."""

from __future__ import annotations

import httpx

from pytest_dflash.refserver.launch import RefServerProcess


def generate(server: RefServerProcess, params: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{server.url}/generate", json={"text": "The quick brown fox", "sampling_params": params},
                      timeout=30)


def test_top_k_zero_is_greedy_at_temperature_zero_and_an_error_when_sampling(none_server: RefServerProcess) -> None:
    # SGLang rewrites temperature 0 to top_k=1 before verify(): the H200 answered 200 to top_k=0 there.
    assert generate(none_server, {"temperature": 0, "top_k": 0, "max_new_tokens": 4}).status_code == 200
    bad = generate(none_server, {"temperature": 0.8, "top_k": 0, "max_new_tokens": 4})
    assert bad.status_code == 400
    assert bad.json() == {"error": {"message": "top_k must be -1 (disable) or at least 1, got 0."}}


def test_ignore_eos_also_disables_stop_token_ids(none_server: RefServerProcess) -> None:
    # SGLang checks stop_token_ids in the `if not ignore_eos` branch (seen on the H200: not honoured).
    free = generate(none_server, {"temperature": 0, "max_new_tokens": 12}).json()
    stop = free["output_ids"][3]
    honoured = generate(none_server, {"temperature": 0, "max_new_tokens": 12, "stop_token_ids": [stop]}).json()
    assert honoured["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    ignored = generate(none_server, {"temperature": 0, "max_new_tokens": 12, "stop_token_ids": [stop],
                                     "ignore_eos": True}).json()
    assert ignored["meta_info"]["finish_reason"]["type"] == "length"
    assert ignored["output_ids"] == free["output_ids"]
