"""NGRAM, EAGLE / EAGLE3 / STANDALONE and a random draft on the refserver: lossless through the same verify walk as
DFLASH, with the acceptance each should have, and SGLang's start-up rules for their settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from refserver_helpers import Job, run_jobs

from pytest_dflash.refserver.model import BUILTIN_PROMPTS, ByteTokenizer, TinyLM
from pytest_dflash.refserver.server_args import prepare_server_args
from pytest_dflash.refserver.spec import Engine, SamplingParams, ngram_draft

tok = ByteTokenizer()
ENGINES = {
    "NGRAM": {"block_size": 8},
    "EAGLE3 chain": {"num_steps": 3, "block_size": 4},
    "EAGLE3 tree": {"num_steps": 3, "topk": 4, "block_size": 8},
    "STANDALONE": {"num_steps": 4, "block_size": 5},
    "EAGLE tree": {"num_steps": 2, "topk": 2, "block_size": 4},
    "DFLASH random draft": {"random_draft": True},
}


def _jobs(temperature: float) -> list[Job]:
    params = SamplingParams(max_new_tokens=48, temperature=temperature, ignore_eos=True)
    return [Job(tok.encode(p), params, seed=7 + i) for i, p in enumerate(BUILTIN_PROMPTS)]


def _engine(model: TinyLM, name: str) -> Engine:
    return Engine(model, name.split(" ")[0], **ENGINES[name])  # type: ignore[arg-type]


@pytest.mark.parametrize("name", list(ENGINES))
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_every_algorithm_emits_exactly_the_targets_tokens(model: TinyLM, name: str, temperature: float) -> None:
    """Greedy and seeded sampled outputs equal plain decoding's, token for token."""
    plain = [o.output_ids for o in run_jobs(Engine(model, "NONE"), _jobs(temperature))]
    assert [o.output_ids for o in run_jobs(_engine(model, name), _jobs(temperature))] == plain


def _accept_length(model: TinyLM, name: str) -> float:
    outs = run_jobs(_engine(model, name), _jobs(0.0))
    return sum(len(o.output_ids) for o in outs) / sum(o.stats.verify_ct for o in outs)


def test_each_algorithm_accepts_what_it_should(model: TinyLM) -> None:
    """Working drafts accept clearly more than 1 token per verify step; a random draft about 1."""
    lengths = {name: _accept_length(model, name) for name in ENGINES}
    assert lengths["DFLASH random draft"] < 1.1, lengths
    for name in ("NGRAM", "EAGLE3 chain", "EAGLE3 tree", "STANDALONE", "EAGLE tree"):
        assert lengths[name] > 1.3, lengths
    assert lengths["EAGLE3 tree"] > lengths["EAGLE3 chain"], lengths  # 4 candidates per step beat a chain


def test_ngram_drafts_what_followed_the_latest_match() -> None:
    assert ngram_draft([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3], 3) == [7, 5, 1]  # the latest earlier "1 2 3"
    assert ngram_draft([4, 5, 6, 5], 2) == [6, 5]  # only the last token matches
    assert ngram_draft([1, 2, 3], 4) == []


def test_eagle_topk_one_adjusts_the_draft_tokens_as_sglang_does() -> None:
    args = prepare_server_args(["--speculative-algorithm", "eagle3", "--speculative-num-steps", "3",
                                "--speculative-num-draft-tokens", "8"])
    assert (args.speculative_num_draft_tokens, args.speculative_eagle_topk) == (4, 1)
    assert args.adjustments[0] == ("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                                   "speculative_eagle_topk == 1")
    tree = prepare_server_args(["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
                                "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"])
    assert tree.speculative_num_draft_tokens == 8 and tree.as_dict()["speculative_eagle_topk"] == 4


def test_ngram_defaults_to_12_draft_tokens_saying_so() -> None:
    args = prepare_server_args(["--speculative-algorithm", "NGRAM"])
    assert args.speculative_num_draft_tokens == 12
    assert args.adjustments[0].startswith("speculative_num_draft_tokens is set to 12 by default for ngram")
    assert args.adjustments[-1].startswith("Max running requests is reset to 48 for speculative decoding.")


def test_random_draft_and_v1_models_id_are_refserver_flags() -> None:
    args = prepare_server_args(["--speculative-algorithm", "DFLASH", "--random-draft", "--v1-models-id", "other"])
    assert args.random_draft and args.v1_models_id == "other"
    assert args.as_dict()["random_draft"] is True and "adjustments" not in args.as_dict()


def test_an_unsupported_dflash_draft_backend_falls_back_with_sglangs_warning() -> None:
    args = prepare_server_args(["--speculative-algorithm", "DFLASH", "--speculative-draft-attention-backend",
                                "flashmla"])
    assert args.speculative_draft_attention_backend == "flashinfer"
    warnings = (Path(__file__).parents[1] / "data" / "sglang-0.5.17-source" / "speculative_warnings.log").read_text()
    assert f"] {args.adjustments[0]}\n" in warnings  # word for word SGLang's line
