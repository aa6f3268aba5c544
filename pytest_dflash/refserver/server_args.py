"""Command-line flags with SGLang's names, and ServerArgs (logged at start-up, served by /server_info).

SGLang flags a real unit file carries are accepted and logged even where a CPU server has no use for
them, so unit templates can be tried here unchanged. Validation errors are raised as SGLang raises
them (a ValueError out of ServerArgs.__post_init__: traceback, exit status 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# SGLang 0.5.17 imports its function-call parsers (and with them xgrammar) before parsing arguments,
# so a broken xgrammar kills it whatever --grammar-backend says. Same order here.
from pytest_dflash.refserver import grammar  # noqa: F401
from pytest_dflash.refserver.chat_surface import REASONING_PARSERS, TOOL_CALL_PARSERS
from pytest_dflash.refserver.faults import FAULTS, parse_inject
from pytest_dflash.refserver.mimic import KNOWN, MIRRORED, Mimic

__all__ = ["DEFAULT_BLOCK_SIZE", "DEFAULT_DDTREE_BUDGET", "ServerArgs", "build_parser", "prepare_server_args"]

DEFAULT_MODEL_PATH = "refserver/tiny-target"
DEFAULT_CONTEXT_LENGTH = 2048
MAX_CONTEXT_LENGTH = 32768  # the "derived" context length of the built-in model
DEFAULT_BLOCK_SIZE = 8  # SGLang takes DFlash's from the draft model's config (16 on the H200 record)
DEFAULT_DDTREE_BUDGET = 32
# SGLang 0.5.17 ServerArgs._handle_deprecated_args: deprecated tool-call parser names and the ones it serves
DEPRECATED_TOOL_CALL_PARSERS = {"qwen25": "qwen", "glm45": "glm"}
NGRAM_DEFAULT_DRAFT_TOKENS = 12  # SGLang's default for NGRAM
DRAFT_HEAD_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE")
DFLASH_DRAFT_BACKENDS = ("flashinfer", "fa3", "fa4", "triton", "trtllm_mha", "ascend")  # SGLang 0.5.17's
SPECULATIVE_ALGORITHMS = ("NONE", "DFLASH", "DDTREE", *DRAFT_HEAD_ALGORITHMS, "NGRAM")
ATTENTION_BACKENDS = (
    "triton", "flashinfer", "fa3", "fa4", "flashmla", "cutlass_mla", "trtllm_mha", "trtllm_mla",
    "torch_native", "aiter", "wave", "intel_amx", "ascend",
)  # fmt: skip


@dataclass
class ServerArgs:
    """The subset of SGLang's ServerArgs the refserver has, in SGLang's field order."""

    model_path: str = DEFAULT_MODEL_PATH
    tokenizer_path: str | None = None
    tokenizer_mode: str = "auto"
    skip_tokenizer_init: bool = False
    load_format: str = "auto"
    trust_remote_code: bool = False
    context_length: int | None = None
    is_embedding: bool = False
    revision: str | None = None
    dtype: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    max_queued_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int = 8192
    max_prefill_tokens: int = 16384
    schedule_policy: str = "fcfs"
    page_size: int | None = None
    disable_radix_cache: bool = True  # the refserver keeps no prefix cache
    tp_size: int = 1
    pp_size: int = 1  # no flag (no pipeline parallelism here): /server_info says 1, as SGLang 0.5.17 does
    dp_size: int = 1
    ep_size: int = 1  # no flag (no expert parallelism here): /server_info says 1, as SGLang 0.5.17 does
    device: str = "cpu"
    random_seed: int | None = None
    watchdog_timeout: float = 300
    host: str = "127.0.0.1"
    port: int = 30000
    skip_server_warmup: bool = False
    api_key: str | None = field(default=None, repr=False)
    served_model_name: str | None = None
    weight_version: str = "default"
    chat_template: str | None = None
    log_level: str = "info"
    log_requests: bool = False
    enable_metrics: bool = False
    decode_log_interval: int = 40
    attention_backend: str | None = None
    sampling_backend: str | None = None
    grammar_backend: str | None = None
    constrained_json_disable_any_whitespace: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None
    disable_overlap_schedule: bool = False
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_dflash_block_size: int | None = None
    speculative_ddtree_budget: int | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_draft_attention_backend: str | None = None
    speculative_draft_window_size: int | None = None
    enable_deterministic_inference: bool = False
    # refserver-only
    random_draft: bool = False
    v1_models_id: str | None = None
    model_seed: int = 0
    gpu_step_ms: float = 0.0
    gpu_draft_ms: float | None = None
    gpu_token_us: float = 0.0
    inject: dict[str, float] = field(default_factory=dict)
    # SGLang's start-up warnings about speculative settings it changed, logged before the server_args line
    adjustments: list[str] = field(default_factory=list, repr=False)
    mimic: Mimic = field(default=Mimic(), repr=False)  # --mimic-version (refserver/mimic.py)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerArgs:
        attrs = [f.name for f in dataclasses.fields(cls)]
        return cls(**{attr: getattr(args, attr) for attr in attrs})

    def __post_init__(self) -> None:
        self.tokenizer_path = self.tokenizer_path or self.model_path
        self.served_model_name = self.served_model_name or self.model_path
        if self.random_seed is None:
            self.random_seed = random.randint(0, 1 << 30)
        if self.context_length is not None and self.context_length > MAX_CONTEXT_LENGTH:
            raise ValueError(
                f"Warning: User-specified context_length ({self.context_length}) is greater than the derived "
                f"context_length ({MAX_CONTEXT_LENGTH}). This may lead to incorrect model outputs or CUDA "
                "errors. Note that the derived context_length may differ from max_position_embeddings in "
                "the model's config. To allow overriding this maximum, set the env var "
                "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"
            )
        self.sampling_backend = self.sampling_backend or "flashinfer"
        self.attention_backend = self.attention_backend or "triton"
        self.grammar_backend = self.grammar_backend or "xgrammar"
        # as SGLang 0.5.17's ServerArgs._handle_deprecated_args: /server_info then says the new name
        parser = self.tool_call_parser
        self.tool_call_parser = DEPRECATED_TOOL_CALL_PARSERS.get(parser, parser) if parser else parser
        self.page_size = self.page_size or 1
        if self.tp_size < 1:
            raise ValueError(f"--tp-size must be >= 1, got {self.tp_size}")
        for fault in ("rank-crash", "rank-hang", "rank-oom"):
            if fault in self.inject and int(self.inject[fault]) >= self.tp_size:
                raise ValueError(f"--inject {fault}={int(self.inject[fault])}: there is no rank "
                                 f"{int(self.inject[fault])} with --tp-size {self.tp_size}")
        if "nccl-init-hang" in self.inject and self.tp_size < 2:
            raise ValueError("--inject nccl-init-hang needs --tp-size 2 or more (one GPU has no NCCL init)")
        self.speculative_algorithm = (self.speculative_algorithm or "NONE").upper()
        if self.speculative_algorithm != "NONE":
            _handle_speculative(self)
        elif self.max_running_requests is None:
            self.max_running_requests = 4096

    @property
    def effective_context_length(self) -> int:
        return self.context_length or DEFAULT_CONTEXT_LENGTH

    @property
    def block_size(self) -> int:
        return self.speculative_num_draft_tokens or DEFAULT_BLOCK_SIZE

    @property
    def ddtree_budget(self) -> int:
        return self.speculative_ddtree_budget or DEFAULT_DDTREE_BUDGET

    def as_dict(self) -> dict[str, Any]:
        """server_args as /server_info shows them (the API key's value is never shown)."""
        hidden = ("inject", "adjustments", "mimic")
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in hidden}
        out["api_key"] = None if self.api_key is None else "<redacted>"
        out["inject"] = ",".join(_describe(self.inject)) or None
        return out

    def log_line(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        return f"server_args=ServerArgs({shown})"


def _describe(inject: dict[str, float]) -> list[str]:
    """As written: 'hang', 'slow-load=5', 'rank-crash=1@3' (a rank fault always shows its rank)."""
    out = []
    for name, value in inject.items():
        if name.endswith("@"):
            continue
        after = f"@{inject[name + '@']:g}" if name + "@" in inject else ""
        ranked = FAULTS[name].rank if name in FAULTS else False
        out.append(name if value == 0 and not ranked else f"{name}={value:g}{after}")
    return out


def _handle_speculative(server_args: ServerArgs) -> None:
    """Block size / budget checks, in SGLang's words where SGLang has them."""
    algo = server_args.speculative_algorithm
    if (
        server_args.speculative_num_draft_tokens is not None
        and server_args.speculative_dflash_block_size is not None
        and server_args.speculative_num_draft_tokens != server_args.speculative_dflash_block_size
    ):
        raise ValueError(
            "Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set but they "
            f"differ. For DFLASH they must match. "
            f"speculative_num_draft_tokens={server_args.speculative_num_draft_tokens}, "
            f"speculative_dflash_block_size={server_args.speculative_dflash_block_size}."
        )
    block = server_args.speculative_num_draft_tokens or server_args.speculative_dflash_block_size
    if algo in DRAFT_HEAD_ALGORITHMS:
        # SGLang's EAGLE rules: num_steps and topk default small; topk 1 drafts a chain of num_steps tokens
        server_args.speculative_num_steps = server_args.speculative_num_steps or 3
        server_args.speculative_eagle_topk = server_args.speculative_eagle_topk or 1
        if server_args.speculative_eagle_topk == 1 and block != server_args.speculative_num_steps + 1:
            if block is not None:
                server_args.adjustments.append(
                    "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                    "speculative_eagle_topk == 1")
            block = server_args.speculative_num_steps + 1
        block = block or 2 * server_args.speculative_num_steps * server_args.speculative_eagle_topk
    elif algo == "NGRAM" and block is None:
        block = NGRAM_DEFAULT_DRAFT_TOKENS
        server_args.adjustments.append(
            f"speculative_num_draft_tokens is set to {block} by default for ngram speculative decoding. "
            "You can override this by explicitly setting --speculative-num-draft-tokens.")
    else:
        server_args.speculative_num_steps = server_args.speculative_num_steps or 1
        server_args.speculative_eagle_topk = server_args.speculative_eagle_topk or 1
    if algo in ("DFLASH", "DDTREE", *DRAFT_HEAD_ALGORITHMS):
        draft_backend = server_args.speculative_draft_attention_backend or server_args.attention_backend
        if algo in ("DFLASH", "DDTREE") and draft_backend not in DFLASH_DRAFT_BACKENDS:
            # SGLang 0.5.17 (arg_groups/speculative_hook.py): the draft runs on another backend, said once
            server_args.adjustments.append(
                f"DFLASH draft worker only supports attention_backend in {DFLASH_DRAFT_BACKENDS} for now, "
                f"but got {draft_backend!r}. Falling back to 'flashinfer'.")
            draft_backend = "flashinfer"
        server_args.speculative_draft_attention_backend = draft_backend
    server_args.speculative_num_draft_tokens = block or DEFAULT_BLOCK_SIZE
    if server_args.speculative_num_draft_tokens < 2:
        raise ValueError(f"{algo} needs a block of at least 2 tokens, got "
                         f"{server_args.speculative_num_draft_tokens}.")
    if algo == "DDTREE":
        if server_args.page_size != 1:
            raise ValueError("DDTREE speculative decoding requires --page-size 1.")
        server_args.speculative_ddtree_budget = server_args.speculative_ddtree_budget or DEFAULT_DDTREE_BUDGET
        if server_args.speculative_ddtree_budget < 1:
            raise ValueError(f"--speculative-ddtree-budget must be >= 1, got "
                             f"{server_args.speculative_ddtree_budget}.")
    if server_args.max_running_requests is None:
        server_args.max_running_requests = 48
        server_args.adjustments.append(
            "Max running requests is reset to 48 for speculative decoding. You can override this by "
            "explicitly setting --max-running-requests.")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pytest_dflash.refserver",
        description="A CPU test double of an SGLang 0.5.17 DFlash/DDTree server.",
    )
    a = p.add_argument
    a("--model-path", default=DEFAULT_MODEL_PATH, help="a label: the model id in /v1/models")
    a("--tokenizer-path", default=None)
    a("--served-model-name", default=None)
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=30000, help="0 picks a free port (logged in 'Uvicorn running on')")
    a("--context-length", type=int, default=None, help=f"default {DEFAULT_CONTEXT_LENGTH}")
    a("--random-seed", type=int, default=None, help="seeds unseeded sampled requests")
    a("--model-seed", type=int, default=0, help="refserver only: seeds the model weights")
    a("--gpu-step-ms", type=float, default=0.0,
      help="refserver only: emulate a GPU's cost model — a scheduler iteration (one decode or verify pass "
           "for every running request) takes at least this long whatever the batch size; 0 = CPU speed")
    a("--gpu-draft-ms", type=float, default=None,
      help="refserver only: the drafter's pass in that model (default: --gpu-step-ms / 8)")
    a("--gpu-token-us", type=float, default=0.0,
      help="refserver only: what each token a pass verifies adds to an iteration (batch x tokens per "
           "sequence: 1 for NONE, --speculative-num-draft-tokens, DDTREE's budget + 1), so speculation's "
           "advantage falls with concurrency; 0 = a pass costs the same for any batch")
    a("--speculative-algorithm", type=str.upper, choices=SPECULATIVE_ALGORITHMS, default=None)
    a("--speculative-draft-model-path", default=None, help="accepted; the drafter is built in")
    a("--speculative-num-draft-tokens", type=int, default=None,
      help=f"block size, default {DEFAULT_BLOCK_SIZE}")
    a("--speculative-dflash-block-size", type=int, default=None,
      help="alias of --speculative-num-draft-tokens")
    a("--speculative-ddtree-budget", type=int, default=None,
      help=f"tree nodes, default {DEFAULT_DDTREE_BUDGET}")
    a("--speculative-num-steps", type=int, default=None,
      help="EAGLE/EAGLE3/STANDALONE: draft steps (default 3)")
    a("--speculative-eagle-topk", type=int, default=None,
      help="EAGLE/EAGLE3/STANDALONE: candidates per step (1: a chain; default 1)")
    a("--speculative-draft-attention-backend", choices=ATTENTION_BACKENDS, default=None)
    a("--speculative-draft-window-size", "--speculative-dflash-draft-window-size", type=int, default=None,
      help="accepted and logged (the second name is 0.5.17's deprecated alias, gone in 0.5.20)")
    a("--random-draft", action="store_true",
      help="refserver only: the drafter proposes random tokens, as a random-weight draft model: almost never "
           "accepted ('accept len: 1.00, accept rate: 0.00'); output stays lossless")
    a("--v1-models-id", default=None,
      help="refserver only: /v1/models lists this id instead of the served model name (a server that names "
           "another model than /model_info and /server_info)")
    a("--enable-metrics", action="store_true", help="serve /metrics (404 without, as SGLang)")
    a("--log-level", default="info", choices=("debug", "info", "warning", "error", "critical"))
    a("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    # Accepted and logged, like a real unit file would pass them.
    a("--attention-backend", choices=ATTENTION_BACKENDS, default=None)
    a("--sampling-backend", choices=("flashinfer", "pytorch", "ascend"), default=None)
    a("--grammar-backend", choices=("xgrammar", "outlines", "llguidance", "none"), default=None,
      help="the refserver serves every backend but none with xgrammar (refserver/structured.py)")
    a("--tool-call-parser", choices=TOOL_CALL_PARSERS, default=None,
      help="parse <tool_call> blocks into message.tool_calls (refserver/chat_surface.py)")
    a("--reasoning-parser", choices=REASONING_PARSERS, default=None,
      help="separate reasoning (up to </think>) into message.reasoning_content")
    a("--constrained-json-disable-any-whitespace", action="store_true",
      help="json_schema output without free whitespace between tokens (xgrammar any_whitespace=False)")
    a("--mem-fraction-static", type=float, default=None)
    a("--page-size", type=int, default=None)
    a("--tp-size", "--tp", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    a("--dp-size", "--dp", dest="dp_size", type=int, default=1)
    a("--disable-cuda-graph", action="store_true")
    a("--cuda-graph-max-bs", type=int, default=None)
    a("--cuda-graph-max-bs-decode", dest="cuda_graph_max_bs", type=int, default=None)
    a("--max-running-requests", type=int, default=None)
    a("--trust-remote-code", action="store_true")
    a("--dtype", choices=("auto", "half", "float16", "bfloat16", "float", "float32"), default="auto")
    a("--disable-overlap-schedule", action="store_true")
    a("--enable-deterministic-inference", action="store_true")
    a("--skip-server-warmup", action="store_true")
    a(
        "--inject",
        type=parse_inject,
        action="append",
        default=[],
        metavar="NAME[=VALUE][,...]",
        help=f"fault injection, NAME[=VALUE],...: {', '.join(FAULTS)} (docs/refserver.md)",
    )
    # Taken out of argv before parsing (refserver/mimic.py split_argv: a flag the release removed exits 2 as
    # SGLang's parser does); declared here so --help lists it.
    a(
        "--mimic-version",
        metavar="VERSION",
        choices=KNOWN,
        default=MIRRORED,
        help=f"refserver only: answer as this SGLang release would (flags, endpoints, log lines): "
        f"{', '.join(KNOWN)}; default {MIRRORED} (docs/refserver.md)",
    )
    return p


def prepare_server_args(argv: Sequence[str]) -> ServerArgs:
    """Parse flags (bad flag: exit 2) and validate them (bad combination: ValueError)."""
    raw = build_parser().parse_args(list(argv))
    merged: dict[str, float] = {}
    for part in raw.inject:
        merged.update(part)
    raw.inject = merged
    for f in dataclasses.fields(ServerArgs):
        if not hasattr(raw, f.name):
            default: Any = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            setattr(raw, f.name, default)
    return ServerArgs.from_cli_args(raw)
