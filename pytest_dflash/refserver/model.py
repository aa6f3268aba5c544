"""A tiny decoder-only transformer (the target), its drafter, a byte tokenizer and a chat template.

Everything is generated from a seed, nothing is downloaded. Compute is float64 and every logit row
is rounded to a 2**-20 grid, so a row computed in a k-token verify pass equals the same row computed
by k single-token decodes (float64 noise is ~1e-15, far below the grid) and argmax ties break to the
lowest id. That makes greedy NONE, DFLASH and DDTREE token-identical by construction.

The target's logits are ``unembed(transformer(x)) + bigram[prev] + prior``: the bigram rows differ
in sharpness, so some positions are confident and some flat, and the transformer adds context and
position dependence. The drafter (a stand-in for DFlash's block-diffusion draft model) sees the same
bigram table through noise and proposes a block from per-position distributions, so it agrees with
the target often but not always.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "BUILTIN_PROMPTS",
    "EOS_IDS",
    "VOCAB_SIZE",
    "ByteTokenizer",
    "Drafter",
    "KVCache",
    "ModelConfig",
    "TinyLM",
    "apply_chat_template",
]

SPECIAL_TOKENS: dict[str, int] = {
    "<|endoftext|>": 256,
    "<|im_start|>": 257,
    "<|im_end|>": 258,
    "<|MASK|>": 259,  # DFlash's mask token (real: mask_token_id in the draft config)
}
VOCAB_SIZE = 260
RANDOM_DRAFT_SEED = 7  # --random-draft: the draft rows come from this generator, not from the target
EOS_IDS: tuple[int, ...] = (256, 258)  # like Qwen: <|endoftext|> and <|im_end|> both end a turn
LOGIT_GRID = 2.0**-20  # see module docstring: makes batched and single-step rows identical

# Prompts the accept-length numbers and the losslessness tests are measured on.
BUILTIN_PROMPTS: tuple[str, ...] = (
    "The quick brown fox",
    "Hello world!",
    "The capital city of France is",
    "Once upon a time, in a land far away,",
    "def fibonacci(n):",
    "Speculative decoding drafts several tokens and verifies them in one pass.",
    "1, 2, 3, 4, 5,",
    "Q: What is the boiling point of water?\nA:",
)


class ByteTokenizer:
    """Bytes 0-255 are tokens 0-255; the special tokens follow."""

    vocab_size = VOCAB_SIZE
    eos_token_id = SPECIAL_TOKENS["<|endoftext|>"]

    def encode(self, text: str) -> list[int]:
        """Encode text; the special-token strings become their single ids."""
        ids: list[int] = []
        rest = text
        while rest:
            hits = [(rest.find(tok), tok) for tok in SPECIAL_TOKENS if tok in rest]
            if not hits:
                ids.extend(rest.encode("utf-8"))
                break
            at, tok = min(hits)
            ids.extend(rest[:at].encode("utf-8"))
            ids.append(SPECIAL_TOKENS[tok])
            rest = rest[at + len(tok) :]
        return ids

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        """Decode ids; invalid UTF-8 becomes U+FFFD as with a real byte-level BPE."""
        return self._bytes(ids, skip_special_tokens).decode("utf-8", errors="replace")

    def decode_complete(self, ids: list[int]) -> str:
        """Decode up to the last complete UTF-8 character (what a stream may show so far)."""
        raw = self._bytes(ids, True)
        return raw[: len(raw) - _incomplete_tail(raw)].decode("utf-8", errors="replace")

    @staticmethod
    def _bytes(ids: list[int], skip_special_tokens: bool) -> bytes:
        names = {v: k for k, v in SPECIAL_TOKENS.items()}
        out = bytearray()
        for i in ids:
            if i < 256:
                out.append(i)
            elif not skip_special_tokens:
                out.extend(names[i].encode())
        return bytes(out)


def _incomplete_tail(raw: bytes) -> int:
    """How many trailing bytes belong to a UTF-8 character that is not finished yet."""
    for back in range(1, min(4, len(raw)) + 1):
        byte = raw[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: keep looking for the lead byte
            continue
        need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
        return back if need > back else 0
    return 0


def apply_chat_template(messages: list[dict[str, object]]) -> str:
    """ChatML, as Qwen models use it, ending with the assistant's turn opener."""
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"<|im_start|>{message.get('role', 'user')}\n{content or ''}<|im_end|>\n")
    return "".join(parts) + "<|im_start|>assistant\n"


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and the knobs that set how confident the target is and how well the drafter guesses."""

    vocab_size: int = VOCAB_SIZE
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 128
    context_length: int = 2048
    transformer_scale: float = 1.5  # weight of the context-dependent part of the logits
    late_layer_scale: float = 0.5  # output scale of layers >= 1: what the early-exit drafter misses


class KVCache:
    """Keys and values of one sequence, per layer; grows on demand."""

    def __init__(self, n_layers: int, n_heads: int, head_dim: int, capacity: int = 64) -> None:
        self.length = 0
        self.k = [torch.zeros(n_heads, capacity, head_dim, dtype=torch.float64) for _ in range(n_layers)]
        self.v = [torch.zeros(n_heads, capacity, head_dim, dtype=torch.float64) for _ in range(n_layers)]

    def reserve(self, extra: int) -> None:
        cap = self.k[0].shape[1]
        if self.length + extra <= cap:
            return
        new_cap = max(2 * cap, self.length + extra)
        for store in (self.k, self.v):
            for i, t in enumerate(store):
                grown = torch.zeros(t.shape[0], new_cap, t.shape[2], dtype=t.dtype)
                grown[:, : self.length] = t[:, : self.length]
                store[i] = grown

    def copy(self) -> KVCache:
        """An independent copy (tests fork one prefilled state into many samples)."""
        twin = KVCache.__new__(KVCache)
        twin.length = self.length
        twin.k = [t.clone() for t in self.k]
        twin.v = [t.clone() for t in self.v]
        return twin

    def keep(self, new_rows: list[int]) -> None:
        """Commit the given rows of the last (uncommitted) forward, in order; drop the others."""
        base = self.length
        idx = torch.tensor([base + r for r in new_rows], dtype=torch.long)
        for store in (self.k, self.v):
            for t in store:
                t[:, base : base + len(new_rows)] = t[:, idx]
        self.length = base + len(new_rows)


class TinyLM:
    """The target model. ``forward`` runs any set of new tokens with an ancestor mask in ONE pass."""

    def __init__(self, config: ModelConfig, seed: int) -> None:
        self.config = config
        gen = torch.Generator().manual_seed(seed)

        def randn(*shape: int, std: float) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

        d, v, f = config.d_model, config.vocab_size, config.d_ff
        self.head_dim = d // config.n_heads
        self.embed = randn(v, d, std=1.0)
        self.layers: list[dict[str, torch.Tensor]] = []
        for i in range(config.n_layers):
            out_std = 1.0 if i == 0 else config.late_layer_scale
            wq, wk, wv = (randn(d, d, std=d**-0.5) for _ in range(3))
            self.layers.append(
                {
                    "wqkv": torch.cat([wq, wk, wv], dim=1),  # one matmul for q, k and v
                    "wo": randn(d, d, std=d**-0.5 * out_std),
                    "w1": randn(d, f, std=d**-0.5),
                    "w2": randn(f, d, std=f**-0.5 * out_std),
                }
            )
        self.unembed = randn(d, v, std=d**-0.5 * config.transformer_scale)
        self.bigram, self.prior = _bigram_tables(gen, v)
        self.bigram_prior = self.bigram + self.prior
        pos = torch.arange(config.context_length + 64, dtype=torch.float64)[:, None]
        freq = torch.exp(-math.log(10000.0) * torch.arange(0, d, 2, dtype=torch.float64) / d)
        self.pos_table = torch.zeros(pos.shape[0], d, dtype=torch.float64)
        self.pos_table[:, 0::2] = torch.sin(pos * freq)
        self.pos_table[:, 1::2] = torch.cos(pos * freq)

    def new_cache(self, capacity: int = 64) -> KVCache:
        return KVCache(self.config.n_layers, self.config.n_heads, self.head_dim, capacity)

    def forward(
        self,
        tokens: list[int],
        cache: KVCache,
        parents: list[int] | None = None,
        *,
        offset: int = 0,
        n_layers: int | None = None,
    ) -> np.ndarray:
        """Logits (float64, rounded to the grid) for each new token, from ONE pass.

        ``parents[i]`` is the index of token i's parent among the new tokens, -1 for the last row
        before them; None means a chain. The new tokens are written at row ``cache.length + offset``
        on; each sees every row before that and its own ancestors, at position row + depth. Nothing
        is committed: call ``cache.keep`` with the rows to keep. ``n_layers=1`` is the early exit
        the drafter uses. (No tensor here requires grad, so autograd records nothing.)
        """
        n = len(tokens)
        past = cache.length + offset
        cache.reserve(offset + n)
        if n == 1:
            ids: torch.Tensor | slice = slice(tokens[0], tokens[0] + 1)
        else:
            ids = torch.tensor(tokens, dtype=torch.long)
        mask: torch.Tensor | None = None
        if parents is None:  # a chain: positions past.., causal mask
            pos = self.pos_table[past : past + n]
            if n > 1:
                mask = torch.zeros(n, past + n, dtype=torch.float64)
                mask[:, past:] = torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)
        else:
            depth = [0] * n
            allowed = torch.zeros(n, n, dtype=torch.bool)
            for i, p in enumerate(parents):
                depth[i] = 0 if p < 0 else depth[p] + 1
                allowed[i, i] = True
                if p >= 0:
                    allowed[i] |= allowed[p]
            pos = self.pos_table[torch.tensor([past + dd for dd in depth], dtype=torch.long)]
            mask = torch.zeros(n, past + n, dtype=torch.float64)
            mask[:, past:] = torch.where(allowed, 0.0, float("-inf"))
        x = self.embed[ids] + pos
        h, dh = self.config.n_heads, self.head_dim
        scale = dh**-0.5
        for li, w in enumerate(self.layers[:n_layers]):
            qkv = (_rms(x) @ w["wqkv"]).view(n, 3, h, dh).permute(1, 2, 0, 3)  # [3, heads, n, dh]
            cache.k[li][:, past : past + n] = qkv[1]
            cache.v[li][:, past : past + n] = qkv[2]
            scores = qkv[0] @ cache.k[li][:, : past + n].transpose(1, 2) * scale
            if mask is not None:
                scores = scores + mask
            att = torch.softmax(scores, dim=-1) @ cache.v[li][:, : past + n]
            x = x + att.transpose(0, 1).reshape(n, -1) @ w["wo"]
            x = x + torch.relu(_rms(x) @ w["w1"]) @ w["w2"]
        logits = _rms(x) @ self.unembed + self.bigram_prior[ids]
        return np.asarray(torch.round(logits / LOGIT_GRID) * LOGIT_GRID)


class Drafter:
    """Drafts a block with the target's first layer (an early exit), reusing the target's KV cache.

    A stand-in for DFlash's draft model, which is conditioned on the target's hidden features: it
    agrees with the target where the later layers change little, so acceptance is realistic. It
    drafts greedily and returns every position's distribution, so DDTREE can branch on the top
    candidates per position.
    """

    def __init__(self, target: TinyLM, *, random_draft: bool = False) -> None:
        self.target = target
        # --random-draft: rows from a seeded generator, unrelated to the target (a random-weight draft model)
        self.random = np.random.default_rng(RANDOM_DRAFT_SEED) if random_draft else None

    def propose(self, pending: int, cache: KVCache, length: int) -> list[np.ndarray]:
        """Log-probabilities of the next ``length`` positions after ``pending``, along the greedy draft.

        Scribbles on the rows after ``cache.length``; the verify pass overwrites them.
        """
        if self.random is not None:
            noise = self.random.standard_normal((length, VOCAB_SIZE)) * 4.0
            return [z - z.max() - math.log(float(np.exp(z - z.max()).sum())) for z in noise]
        rows = []
        tok = pending
        for j in range(length):
            z = self.target.forward([tok], cache, offset=j, n_layers=1)[0]
            z = z - z.max()
            row = z - math.log(float(np.exp(z).sum()))
            rows.append(row)
            tok = int(row.argmax())
        return rows


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + 1e-6)


def _bigram_tables(gen: torch.Generator, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bigram logits whose rows range from sharp to flat, and a prior favouring printable text."""
    sharpness = torch.exp(torch.empty(vocab, 1, dtype=torch.float64).uniform_(0.0, 2.2, generator=gen))
    bigram = torch.randn(vocab, vocab, generator=gen, dtype=torch.float64) * sharpness
    prior = torch.full((vocab,), -4.0, dtype=torch.float64)
    prior[32:127] = 0.0  # printable ASCII
    prior[10] = 0.0  # newline
    prior[128:256] = -2.5  # high bytes: sometimes, so invalid UTF-8 shows up as U+FFFD
    prior[SPECIAL_TOKENS["<|endoftext|>"]] = -1.0
    prior[SPECIAL_TOKENS["<|im_start|>"]] = -30.0
    prior[SPECIAL_TOKENS["<|im_end|>"]] = -1.5
    prior[SPECIAL_TOKENS["<|MASK|>"]] = -30.0
    return bigram, prior
