from __future__ import annotations

import pytest

from pytest_dflash.evidence.redact import MASK, redact


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz123", "hf_abcdefghijklmnopqrstuvwxyz123"),
        ("Authorization: Bearer abc.def-123456789", "abc.def-123456789"),
        ("ExecStart=/x -m sglang.launch_server --api-key sk-secret123 --port 1", "sk-secret123"),
        ("--api-key=topsecretvalue", "topsecretvalue"),
        ("http://admin:pa55word@10.0.0.1:8080/v1", "pa55word"),
        ("Environment=OPENAI_API_KEY=foo-bar-baz", "foo-bar-baz"),
        ('server_args=ServerArgs(api_key=\'k3y-value\', port=1)', "k3y-value"),
        ('{"api_key": "zzzzzz"}', "zzzzzz"),
        ("token sk-proj-ABCDEFGHIJKLMNOPQRSTUV in a log", "sk-proj-ABCDEFGHIJKLMNOPQRSTUV"),
        ("password=hunter2", "hunter2"),
    ],
)
def test_secrets_are_masked(text: str, secret: str) -> None:
    clean = redact(text)
    assert secret not in clean
    assert MASK in clean


@pytest.mark.parametrize(
    "text",
    [
        '"completion_tokens":32,"prompt_tokens":4',
        "max_new_tokens=64, stop_token_ids=[1, 2]",
        '"eos_token": "<|im_end|>"',
        "Decode batch, #running-req: 1, #token: 64, accept len: 1.00",
        "Prefill batch, #new-seq: 1, #new-token: 3, #cached-token: 1, #pending-token: 0",
    ],
)
def test_token_counts_are_not_secrets(text: str) -> None:
    assert redact(text) == text


def test_known_literal_secrets_are_masked_anywhere() -> None:
    assert "s3cr3t-value" not in redact("echo s3cr3t-value", extra=("s3cr3t-value",))
