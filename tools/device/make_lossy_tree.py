#!/usr/bin/env python3
"""A SEPARATE copy of the DDTree-overlaid SGLang tree with a lossy verify step (a fault, for the parity
suite).

    python3 make_lossy_tree.py [--src /tmp/site_ddtree] [--dst /tmp/site_ddtree_lossy] [--selftest]

The change (DDTreeWorkerV2._accept_tree, greedy branch): after the target's argmax is taken, each tree node's
"target choice" is replaced by the token of its first child -- the draft's best child (nodes are numbered in
best-first pop order) -- whenever the node has a child. The tree walk then accepts the draft's best path
without checking it against the target: greedy DDTREE output follows the draft, not the target, while sampled
requests (native tree sampling) are untouched. The mirror of the refserver's tree-verify-bug, made worse.

Like apply_overlay.py it never writes through a hard link: DST is a `cp -al` copy of SRC, and the one patched
file is unlinked and written anew (SRC stays intact; checked by hash). Standard library only, except
--selftest, which needs torch (CPU) and checks the inserted lines on a tree built by the port's own builder.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import py_compile
import subprocess
import sys
import tempfile

REL = os.path.join("sglang", "srt", "speculative", "ddtree_worker_v2.py")
ANCHOR = """            target_predict = torch.argmax(
                logits_output.next_token_logits, dim=-1
            ).view(bs, q_len)
"""
FAULT = (
    "            # LOSSY FAULT (pytest-dflash issue 16; a test tree only): accept each node's best draft "
    "child\n"
    "            # without checking it against the target's argmax.\n"
    "            _first_child = torch.full_like(parents, q_len).scatter_reduce_(1, "
    "parents[:, 1:].clamp(min=0), "
    "torch.arange(1, q_len, device=parents.device).expand(bs, -1).contiguous(), reduce=\"amin\")\n"
    "            target_predict = torch.where(_first_child < q_len, draft_tokens.gather(1, "
    "_first_child.clamp(max=q_len - 1)), target_predict)\n"
)


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def selftest(src: str) -> None:
    """The inserted lines on a real (port-built) tree: the walk must follow the first-child chain."""
    import importlib.util

    import torch
    spec = importlib.util.spec_from_file_location(
        "ddu", os.path.join(src, "sglang", "srt", "speculative", "ddtree_utils.py"))
    ddu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ddu)
    torch.manual_seed(0)
    depth, k, budget = 15, 8, 32
    lp = torch.log_softmax(torch.randn(depth, 64), -1).topk(k)
    _, _, parents_np, cmap, _, size = ddu._build_single_tree(lp.values, lp.indices, k, depth, budget)
    q_len, bs = size, 1
    tokens = [0] * size
    for children in cmap.values():
        for tok, idx in children.items():
            tokens[idx] = tok
    draft_tokens = torch.tensor([tokens])
    parents = torch.tensor([list(parents_np)], dtype=torch.long)
    target_predict = torch.full((bs, q_len), 999)  # the target agrees with nothing
    scope = {"torch": torch, "parents": parents, "q_len": q_len, "bs": bs, "draft_tokens": draft_tokens,
             "target_predict": target_predict}
    exec("\n".join(line.strip() for line in FAULT.splitlines()), scope)
    tp = scope["target_predict"]
    paths, nxt, _ = ddu.follow_verified_tree([cmap], tp)
    chain, node = [0], 0
    while cmap.get(node):
        node = min(cmap[node].values())
        chain.append(node)
    assert paths[0] == chain, (paths[0], chain)
    assert int(nxt[0]) == 999, nxt
    print(f"selftest: the lossy walk accepts the draft's first-child chain {chain} (tree of {size} nodes)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default="/tmp/site_ddtree")
    ap.add_argument("--dst", default="/tmp/site_ddtree_lossy")
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args()
    src_file = os.path.join(args.src, REL)
    with open(src_file, encoding="utf-8") as f:
        text = f.read()
    if text.count(ANCHOR) != 1:
        sys.exit(f"{src_file}: the greedy argmax anchor occurs {text.count(ANCHOR)} times (expected 1)")
    before = sha256(src_file)
    if os.path.exists(args.dst):
        sys.exit(f"{args.dst} exists; remove it first")
    subprocess.check_call(["cp", "-al", args.src, args.dst])
    dst_file = os.path.join(args.dst, REL)
    os.unlink(dst_file)
    with open(dst_file, "w", encoding="utf-8") as f:
        f.write(text.replace(ANCHOR, ANCHOR + FAULT))
    cache = os.path.join(os.path.dirname(dst_file), "__pycache__")
    if os.path.isdir(cache):
        for name in os.listdir(cache):
            if name.startswith("ddtree_worker_v2."):
                os.unlink(os.path.join(cache, name))
    if sha256(src_file) != before:
        sys.exit(f"BUG: {src_file} changed")
    with tempfile.TemporaryDirectory() as tmp:
        py_compile.compile(dst_file, cfile=os.path.join(tmp, "x.pyc"), doraise=True)
    print(f"lossy tree: {args.dst} ({REL} patched: accept the draft's best child unchecked); {args.src} "
          f"unchanged")
    if args.selftest:
        selftest(args.src)
    return 0


if __name__ == "__main__":
    sys.exit(main())
