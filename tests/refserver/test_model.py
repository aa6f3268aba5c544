"""The model: tokenizer, chat template, seeded weights, and one-pass verify rows == single-step rows."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_dflash.refserver.model import (
    BUILTIN_PROMPTS,
    EOS_IDS,
    ByteTokenizer,
    Drafter,
    ModelConfig,
    TinyLM,
    apply_chat_template,
)

tok = ByteTokenizer()


def test_tokenizer_round_trips_utf8_and_special_tokens() -> None:
    text = "héllo <|im_start|>user\n✓<|endoftext|>"
    ids = tok.encode(text)
    assert ids.count(257) == 1 and ids[-1] == 256
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.decode(ids) == "héllo user\n✓"


def test_stream_decode_holds_back_an_unfinished_character() -> None:
    ids = list("ab✓".encode())
    assert tok.decode_complete(ids[:-1]) == "ab"  # ✓ is 3 bytes; 2 are not a character yet
    assert tok.decode_complete(ids) == "ab✓"
    assert tok.decode([0xFF]) == "\ufffd"  # invalid UTF-8 decodes like a byte-level BPE


def test_chat_template_is_chatml() -> None:
    prompt = apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": [{"text": "U"}]}])
    assert prompt == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"


def test_weights_are_deterministic_from_the_seed(model: TinyLM) -> None:
    ids = tok.encode("seeded")
    a = model.forward(ids, model.new_cache())
    b = TinyLM(ModelConfig(), seed=0).forward(ids, model.new_cache())
    c = TinyLM(ModelConfig(), seed=1).forward(ids, model.new_cache())
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def greedy_rows(model: TinyLM, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy continuation by single-token steps, and the row each token came from."""
    cache = model.new_cache()
    rows = [model.forward(prompt, cache)[-1]]
    cache.keep(list(range(len(prompt))))
    out = [int(rows[-1].argmax())]
    while len(out) < n:
        rows.append(model.forward([out[-1]], cache)[0])
        cache.keep([0])
        out.append(int(rows[-1].argmax()))
    return out, rows


@pytest.mark.parametrize("prompt", BUILTIN_PROMPTS[:4])
def test_chain_verify_rows_equal_single_step_rows(model: TinyLM, prompt: str) -> None:
    ids = tok.encode(prompt)
    out, rows = greedy_rows(model, ids, 12)
    cache = model.new_cache()
    model.forward(ids, cache)
    cache.keep(list(range(len(ids))))
    chain = model.forward(out[:11], cache)  # ONE pass over 11 positions
    for i in range(11):
        assert np.array_equal(chain[i], rows[i + 1]), f"row {i} differs"


def test_tree_rows_equal_the_rows_of_their_own_path(model: TinyLM) -> None:
    """Ancestor-only mask: a node sees its path, never its siblings or cousins."""
    ids = tok.encode(BUILTIN_PROMPTS[0])
    out, rows = greedy_rows(model, ids, 4)
    cache = model.new_cache()
    model.forward(ids, cache)
    cache.keep(list(range(len(ids))))
    # root=out[0]; children: a decoy and out[1]; out[2] under out[1]; another decoy under the decoy
    decoy = (out[1] + 1) % 256
    tokens = [out[0], decoy, out[1], 65, out[2]]
    parents = [-1, 0, 0, 1, 2]
    tree = model.forward(tokens, cache, parents)
    assert np.array_equal(tree[0], rows[1])
    assert np.array_equal(tree[2], rows[2])
    assert np.array_equal(tree[4], rows[3])
    cache.keep([0, 2, 4])  # commit the real path; the next row must match a single step
    assert np.array_equal(model.forward([out[3]], cache)[0], greedy_rows(model, ids, 5)[1][4])


def test_target_has_confident_and_flat_positions(model: TinyLM) -> None:
    """Sampling and parity tests need both: near-certain tokens and near-ties."""
    top = []
    for prompt in BUILTIN_PROMPTS:
        for row in greedy_rows(model, tok.encode(prompt), 48)[1]:
            p = np.exp(row - row.max())
            top.append(p.max() / p.sum())
    top_arr = np.array(top)
    assert (top_arr > 0.9).mean() > 0.1
    assert (top_arr < 0.4).mean() > 0.1


def test_drafter_proposes_valid_distributions(model: TinyLM) -> None:
    ids = tok.encode("draft")
    cache = model.new_cache()
    model.forward(ids[:-1], cache)
    cache.keep(list(range(len(ids) - 1)))
    rows = Drafter(model).propose(ids[-1], cache, 7)
    assert len(rows) == 7
    for row in rows:
        assert row.shape == (model.config.vocab_size,)
        assert abs(np.exp(row).sum() - 1) < 1e-9
    assert cache.length == len(ids) - 1  # drafting commits nothing


def test_eos_ids_are_special_tokens() -> None:
    assert all(i >= 256 for i in EOS_IDS)
