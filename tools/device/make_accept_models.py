#!/usr/bin/env python3
"""A tiny Qwen3 target + DFlash draft on which speculative decoding accepts well above 1 token per step.

    python3 make_accept_models.py OUTDIR [--mode alternate|constant] [--check [--ddtree-src DIR]]
        -> OUTDIR/target, OUTDIR/draft   (same tokenizer, configs and shapes as make_models.py)

Generated, nothing downloaded, deterministic (seeded). Needs torch, safetensors, tokenizers.

How it works (by construction, not by training):

* Every attention ``o_proj`` and MLP ``down_proj`` of the target and of the draft is zero, so each layer adds
  exactly 0 to the residual stream: the last hidden state is the input token's embedding, and the logits are
  ``lm_head @ rmsnorm(embed[t])`` -- a function of the current token alone.
* The embedding and LM head are built on two axes. ``lm_head[A] = beta*e0`` and ``lm_head[B] = beta*e1``;
  every other row of the LM head lives in dims >= 2 (small random values). ``embed[A] = e1 + noise`` and every
  other token's ``embed = e0 + noise`` (noise in dims >= 2). So the target's greedy successor is
  ``f(t) = B if t == A else A``: after any prompt it writes "A B A B A B ..." (mode alternate), or
  ``f(t) = A`` for every t (mode constant: "A A A ...").
* The DFlash draft has no embedding or head of its own: SGLang feeds it the TARGET's embedding of
  ``[bonus, MASK, MASK, ...]`` and reads its hidden states through the TARGET's lm_head
  (sglang/srt/speculative/dflash_worker_v2.py, sglang/srt/models/dflash.py). With zero output projections the
  draft's hidden state at every MASK position is ``rmsnorm(embed[MASK])``, and ``embed[MASK]`` is put in the
  (e0, e1) plane: the draft proposes A and B at every position with nearly equal probability (A slightly
  ahead), and every other token at logit exactly 0.
    - DFLASH (one linear chain of the draft's argmax, "A A A ..."): after a B the target wants A (accepted),
      then B (rejected): 2 tokens per verify step in steady state.
    - DDTREE (best-first tree over the draft's top-k per depth): the balanced A/B binary tree holds the
      alternating path down to depth ~log2(budget): budget 8 -> ~3, 32 -> ~5, 64 -> ~6 tokens per step.
    - mode constant: draft and target agree on A everywhere: both accept the whole block (16 per step).
* Sampling stays non-degenerate: the target's other tokens get logits ~N(0, 1) through the noise dims, so at
  temperature 1 the successor token has probability ~0.6, not 1.

--check computes the same logits in bf16 on the CPU and simulates DFLASH's chain and DDTREE's tree (with the
ddtree-v2 port's own _build_single_tree/follow_verified_tree from --ddtree-src when given) and prints the
expected accept lengths. It does not need SGLang or a GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys

import torch

VOCAB = 1024
HIDDEN, INTER, LAYERS, HEADS, KV, HEAD_DIM = 256, 512, 4, 4, 2, 64
DRAFT_LAYERS, BLOCK = 2, 16
TARGET_LAYER_IDS = [1, 2]
TEXT = """The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a \
single step.
Speculative decoding uses a small draft model to propose several tokens, and the large \
target model verifies them in one pass.
Block diffusion drafters propose a whole block of tokens at once, conditioned on hidden states \
from the target model.
The server answers requests over HTTP with JSON bodies. It streams tokens with server sent events when asked.
Hello world! How are you today? I am fine, thank you. What is the capital of France? \
Paris is the capital of France.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000. Code: def f(x): return x * 2  # comment
Once upon a time there was a small model that learned to write stories about foxes, dogs, cats and birds.
The weather is sunny and warm, the sky is blue, and the river flows quietly past the old mill \
near the village.
"""
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"]
TARGET_LOGIT = 8.0   # the target's logit of its successor token
NOISE_RMS = 1.0      # std of the target's other logits (through the noise dims)
DRAFT_GAP = 0.25     # draft logit of A minus that of B (mode alternate): A is the draft's argmax


def write_json(path: str, obj: object) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)


def build_tokenizer(tgt: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TEXT] * 20, trainer=trainer)
    tok.save(os.path.join(tgt, "tokenizer.json"))
    return tok


def weights(mode: str, ids: dict[str, int], a: int, b: int) -> tuple[dict, dict, dict]:
    """Target weights, draft weights, and a description of the construction."""
    g = torch.Generator().manual_seed(4321)

    def rnd(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    def zeros(*shape):
        return torch.zeros(*shape, dtype=torch.bfloat16)

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    # Hidden state after the final RMSNorm of (e0 + noise): 16 * (e0 + noise) / sqrt(1 + |noise|^2).
    # Noise: per-dim std s over the HIDDEN-2 free dims. Pick |noise|^2 = 1 (s = 1/sqrt(254)): the successor's
    # logit is 16*beta/sqrt(2) = TARGET_LOGIT -> beta; other logits: 16/sqrt(2) * (W_j . noise)
    # ~ N(0, NOISE_RMS).
    free = HIDDEN - 2
    s_noise = 1.0 / math.sqrt(free)
    beta = TARGET_LOGIT * math.sqrt(2) / 16.0
    w_std = NOISE_RMS * math.sqrt(2) / 16.0  # per-dim std of other lm_head rows (dims >= 2), |noise| = 1

    emb = torch.zeros(VOCAB, HIDDEN)
    emb[:, 0] = 1.0
    emb[:, 2:] = torch.randn(VOCAB, free, generator=g) * s_noise
    if mode == "alternate":
        emb[a, 0] = 0.0
        emb[a, 1] = 1.0
    # MASK in the (e0, e1) plane, no noise: the draft's logits are 16*beta*(cos, sin) for A, B and 0
    # elsewhere.
    if mode == "alternate":
        # 16*beta*(cos t - sin t) = DRAFT_GAP
        r = 16.0 * beta
        d = DRAFT_GAP / r  # cos t - sin t
        theta = math.pi / 4 - math.asin(d / math.sqrt(2))
        emb[ids["<|MASK|>"]] = torch.tensor([math.cos(theta), math.sin(theta)] + [0.0] * free)
    else:
        emb[ids["<|MASK|>"]] = torch.tensor([1.0, 0.0] + [0.0] * free)

    lm = torch.zeros(VOCAB, HIDDEN)
    lm[:, 2:] = torch.randn(VOCAB, free, generator=g) * w_std
    lm[a] = 0.0
    lm[a, 0] = beta
    if mode == "alternate":
        lm[b] = 0.0
        lm[b, 1] = beta

    def layer(prefix: str, i: int) -> dict:
        p = f"{prefix}layers.{i}."
        return {
            p + "input_layernorm.weight": ones(HIDDEN), p + "post_attention_layernorm.weight": ones(HIDDEN),
            p + "self_attn.q_proj.weight": rnd(HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": rnd(KV * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": rnd(KV * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": zeros(HIDDEN, HEADS * HEAD_DIM),  # adds exactly 0
            p + "self_attn.q_norm.weight": ones(HEAD_DIM), p + "self_attn.k_norm.weight": ones(HEAD_DIM),
            p + "mlp.gate_proj.weight": rnd(INTER, HIDDEN), p + "mlp.up_proj.weight": rnd(INTER, HIDDEN),
            p + "mlp.down_proj.weight": zeros(HIDDEN, INTER),  # adds exactly 0
        }

    tw = {"model.embed_tokens.weight": emb.to(torch.bfloat16), "model.norm.weight": ones(HIDDEN),
          "lm_head.weight": lm.to(torch.bfloat16)}
    for i in range(LAYERS):
        tw.update(layer("model.", i))
    dw = {"fc.weight": rnd(HIDDEN, HIDDEN * len(TARGET_LAYER_IDS)), "hidden_norm.weight": ones(HIDDEN),
          "norm.weight": ones(HIDDEN)}
    for i in range(DRAFT_LAYERS):
        dw.update(layer("", i))
    info = {"mode": mode, "A": a, "B": b, "beta": beta, "noise_std": s_noise, "other_lm_std": w_std}
    return tw, dw, info


def rmsnorm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16)


def logits_of(emb_rows: torch.Tensor, lm: torch.Tensor) -> torch.Tensor:
    return (rmsnorm(emb_rows) @ lm.t()).float()


def load_ddtree_utils(src: str | None):
    if not src:
        return None
    path = os.path.join(src, "sglang", "srt", "speculative", "ddtree_utils.py")
    if not os.path.exists(path):
        return None
    spec = importlib.util.spec_from_file_location("ddtree_utils_sim", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check(tw: dict, ids: dict, info: dict, prompt_last: list[int], ddtree_src: str | None) -> dict:
    """Simulate greedy DFLASH and DDTREE on the constructed logits; returns the expected accept lengths."""
    emb, lm = tw["model.embed_tokens.weight"], tw["lm_head.weight"]
    tgt = logits_of(emb, lm)                       # [V, V]: logits after token t
    succ = tgt.argmax(-1)                          # greedy successor of each token
    top2 = tgt.topk(2, -1).values
    real = torch.ones(VOCAB, dtype=torch.bool)
    real[ids["<|MASK|>"]] = False  # MASK is only ever the draft's input, never the target's
    margin = float((top2[:, 0] - top2[:, 1])[real].min())
    p_succ = torch.softmax(tgt, -1).gather(1, succ[:, None]).squeeze(1)
    draft = logits_of(emb[ids["<|MASK|>"]][None], lm)[0]  # the same at every MASK position
    dlogp = torch.log_softmax(draft, -1)
    dtop = dlogp.topk(8)
    utils = load_ddtree_utils(ddtree_src)
    out = {"successor_of": {str(t): int(succ[t]) for t in sorted({info["A"], info["B"], *prompt_last})},
           "min_greedy_margin": round(margin, 3), "p_successor_t1_mean": round(float(p_succ.mean()), 3),
           "draft_top": [[int(i), round(float(v), 3)]
                         for v, i in zip(dtop.values, dtop.indices, strict=True)],
           "ddtree_sim": "port's _build_single_tree" if utils else "own best-first"}

    def gen(last: int, n: int) -> list[int]:
        seq = []
        for _ in range(n):
            last = int(succ[last])
            seq.append(last)
        return seq

    def dflash(last: int, steps: int) -> float:
        chain = [int(dlogp.argmax())] * (BLOCK - 1)
        total = 0
        for _ in range(steps):
            truth = gen(last, BLOCK)
            k = 0
            while k < BLOCK - 1 and chain[k] == truth[k]:
                k += 1
            emitted = truth[:k + 1]
            total += len(emitted)
            last = emitted[-1]
        return total / steps

    topk_lp, topk_id = dlogp.topk(64)

    def tree(budget: int):
        depth = BLOCK - 1
        k = min(budget, VOCAB)
        lp = topk_lp[:k].repeat(depth, 1)
        tid = topk_id[:k].repeat(depth, 1)
        if utils is not None:
            _, _, _, cmap, _, _ = utils._build_single_tree(lp, tid, k, depth, budget)
            return cmap
        import heapq
        heap = [(-float(lp[0, 0]), 0, 1, 0, float(lp[0, 0]))]
        cmap: dict[int, dict[int, int]] = {0: {}}
        n = 0
        while heap and n < budget:
            _, parent, d, rank, logw = heapq.heappop(heap)
            n += 1
            cmap.setdefault(parent, {})[int(tid[d - 1, rank])] = n
            cmap.setdefault(n, {})
            if rank + 1 < k:
                w = logw - float(lp[d - 1, rank]) + float(lp[d - 1, rank + 1])
                heapq.heappush(heap, (-w, parent, d, rank + 1, w))
            if d < depth:
                w = logw + float(lp[d, 0])
                heapq.heappush(heap, (-w, n, d + 1, 0, w))
        return cmap

    def ddtree(last: int, steps: int, budget: int) -> float:
        cmap = tree(budget)
        total = 0
        for _ in range(steps):
            truth = gen(last, BLOCK)
            node, k = 0, 0
            while truth[k] in cmap.get(node, {}):
                node = cmap[node][truth[k]]
                k += 1
            emitted = truth[:k + 1]
            total += len(emitted)
            last = emitted[-1]
        return total / steps

    out["expected_accept_length"] = {
        "DFLASH": round(sum(dflash(t, 20) for t in prompt_last) / len(prompt_last), 3),
        **{f"DDTREE_budget{b}": round(sum(ddtree(t, 20, b) for t in prompt_last) / len(prompt_last), 3)
           for b in (8, 15, 32, 64)},
    }
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default="/tmp/models_accept")
    ap.add_argument("--mode", choices=("alternate", "constant"), default="alternate")
    ap.add_argument("--check", action="store_true", help="simulate the accept lengths on the CPU")
    ap.add_argument("--ddtree-src", default=None, help="an overlaid site dir (uses the port's tree builder)")
    args = ap.parse_args()
    tgt, drf = os.path.join(args.out, "target"), os.path.join(args.out, "draft")
    os.makedirs(tgt, exist_ok=True)
    os.makedirs(drf, exist_ok=True)
    from safetensors.torch import save_file

    tok = build_tokenizer(tgt)
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    a, b = tok.token_to_id("Ġfox"), tok.token_to_id("Ġdog")
    assert a is not None and b is not None, "tokenizer lost ' fox' / ' dog'"
    chat_template = ("{% for message in messages %}"
                     "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
                     "'\\n' }}"
                     "{% endfor %}"
                     "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "model_max_length": 4096, "clean_up_tokenization_spaces": False, "add_bos_token": False,
        "chat_template": chat_template,
        "added_tokens_decoder": {str(ids[s]): {"content": s, "lstrip": False, "normalized": False,
                                               "rstrip": False, "single_word": False, "special": True}
                                 for s in SPECIALS},
    }
    write_json(os.path.join(tgt, "tokenizer_config.json"), tok_cfg)
    write_json(os.path.join(tgt, "special_tokens_map.json"),
               {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_attention_heads=HEADS,
                  num_key_value_heads=KV, head_dim=HEAD_DIM, hidden_act="silu", max_position_embeddings=4096,
                  rms_norm_eps=1e-6, rope_theta=1000000.0, attention_bias=False, tie_word_embeddings=False)
    tcfg = dict(common, architectures=["Qwen3ForCausalLM"], model_type="qwen3", num_hidden_layers=LAYERS,
                bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], torch_dtype="bfloat16",
                use_sliding_window=False, sliding_window=None, max_window_layers=LAYERS,
                attention_dropout=0.0, initializer_range=0.02, use_cache=True)
    write_json(os.path.join(tgt, "config.json"), tcfg)
    write_json(os.path.join(tgt, "generation_config.json"),
               {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"]})
    dcfg = dict(common, architectures=["DFlashDraftModel"], model_type="qwen3",
                num_hidden_layers=DRAFT_LAYERS, torch_dtype="bfloat16", block_size=BLOCK,
                num_target_layers=LAYERS,
                dflash_config={"target_layer_ids": TARGET_LAYER_IDS, "mask_token_id": ids["<|MASK|>"]},
                auto_map={"AutoModel": "dflash.DFlashDraftModel"})
    write_json(os.path.join(drf, "config.json"), dcfg)

    tw, dw, info = weights(args.mode, ids, a, b)
    save_file(tw, os.path.join(tgt, "model.safetensors"), metadata={"format": "pt"})
    save_file(dw, os.path.join(drf, "model.safetensors"), metadata={"format": "pt"})
    report = {"target": tgt, "draft": drf, "special_ids": ids, **info,
              "sample_ids": tok.encode("Hello world! The quick brown fox").ids}
    if args.check:
        last = [tok.encode(p).ids[-1] for p in ("Hello world!", "The quick brown fox", "def f(x):",
                                                "Once upon a time", "What is the capital of France?")]
        report["check"] = check(tw, ids, info, last, args.ddtree_src)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
