#!/usr/bin/env python3
"""Tiny EAGLE, EAGLE3 and STANDALONE drafts for the tiny Qwen3 target of .sglang-stage/make_models.py (issue
25 item 4).

    python3 make_spec_drafts.py TARGET_DIR OUTDIR [--draft-vocab N] [--standalone-layers K]
                                [--check [--sglang-src SITE]]
        -> OUTDIR/eagle, OUTDIR/eagle3, OUTDIR/standalone   (on the device: /tmp/models/target /tmp/models)

Generated from the target's config, weights and tokenizer; nothing downloaded; deterministic (seeded). Needs
torch and safetensors only (the same as make_accept_models.py); runs on the CPU in a second.

eagle3/ -- a one-layer EAGLE-3 draft head, random weights, in SGLang 0.5.17's EAGLE-3 checkpoint format
    (sglang/srt/models/llama_eagle3.py, ``LlamaForCausalLMEagle3``; the format of the public EAGLE-3 heads):
    * config: ``architectures = ["LlamaForCausalLMEagle3"]``, ``model_type = "llama"``, the target's hidden
      size, heads, head_dim, rope and vocab; ``num_hidden_layers = 1``; ``draft_vocab_size`` (a reduced draft
      vocabulary, as the public heads have); ``eagle_config.eagle_aux_hidden_state_layer_ids``.
    * weights: ``fc.weight`` [hidden, 3*hidden] over the three captured target hidden states; ``midlayer.*``
      (the legacy name load_weights maps to ``layers.0``: ``hidden_norm``, ``input_layernorm``,
      ``post_attention_layernorm``, q/k/v_proj over 2*hidden -- the embedding and the fc output concatenated
      --, o_proj, gate/up/down_proj); ``norm.weight``; ``lm_head.weight`` [draft_vocab, hidden]; ``d2t``
      (int64, draft id -> target id minus draft id: load_weights makes ``hot_token_id = d2t + arange``) and
      ``t2d`` (bool over the target vocab; load_weights skips it). No ``embed_tokens``: the EAGLE worker gives
      the draft the TARGET's embedding (``set_embed``, speculative/eagle_worker_v2.py ``init_lm_head``); the
      head stays the draft's own because ``draft_vocab_size`` is set (``load_lm_head_from_target`` is False).
    * Which targets capture: Qwen3ForCausalLM has ``set_eagle3_layers_to_capture`` in 0.5.17
      (models/qwen3.py), so the Qwen3 target serves EAGLE3 as is. Its default capture layers are
      ``[2, n//2, n-3]``, which for the 4-layer target is [2, 2, 1]: only TWO distinct states are captured
      (qwen2.py's ``if i in layers_to_capture``), while fc expects three -- a shape error at the first draft
      step. The config therefore names the layers: ``eagle_aux_hidden_state_layer_ids = [0, 1, 2]`` (SGLang
      captures the input of layer id+1, i.e. the outputs of target layers 0, 1 and 2: low, mid, high), read by
      model_executor/model_runner_components/spec_aux_hidden_state.py.
    * Random weights: the target rejects almost every draft token (accept length ~1.0). The profile declares
      ``unaccepted_draft``: the service proves that EAGLE3 loads, captures, drafts and verifies losslessly.

eagle/ -- a one-layer EAGLE (v1) draft head, random weights, in SGLang 0.5.17's EAGLE checkpoint format
    (sglang/srt/models/llama_eagle.py, ``LlamaForCausalLMEagle``; the format of the public EAGLE-1/2 heads):
    * config: ``architectures = ["LlamaForCausalLMEagle"]``, ``model_type = "llama"``, the target's hidden
      size, heads, head_dim, rope and vocab; ``num_hidden_layers = 1``; no draft vocabulary of its own.
    * weights, named as the checkpoint names them (load_weights prefixes ``model.`` to every name but
      ``lm_head``, then LlamaForCausalLM.load_weights stacks q/k/v and gate/up): ``fc.weight`` [hidden,
      2*hidden] and ``fc.bias`` over the token's embedding concatenated with the target's last hidden state;
      ``layers.0.*`` (q/k/v/o_proj, gate/up/down_proj, ``post_attention_layernorm``: layer 0 of an EAGLE head
      has NO ``input_layernorm``, SGLang replaces it by the identity); no final norm (LlamaModel of
      llama_eagle.py returns ``hidden_states + residual``); ``embed_tokens.weight`` and ``lm_head.weight`` are
      replaced by the TARGET's (eagle_worker_v2.py ``init_lm_head``: ``set_embed_and_head`` for every EAGLE
      that is not EAGLE3), so the checkpoint carries the embedding only to match the public heads and no
      head at all.
    * Random weights: accept length ~1.0; the profile declares ``unaccepted_draft``.

standalone/ -- a draft of the target's own architecture and tokenizer for
    ``--speculative-algorithm STANDALONE`` (speculative/standalone_worker_v2.py: a separate model with its OWN
    embedding and head; it checks that vocab size and tokenizer vocab equal the target's). By default it is an
    exact copy of the target's weights and tokenizer: the "perfect draft" control. That is legitimate for
    STANDALONE (any model of the same vocabulary may draft) and it makes the drafts really accepted: with
    greedy verification every draft token is the target's own argmax, so the accept length is num_steps + 1 up
    to bf16 ties between the draft's decode and the target's verify forward. So the profile does NOT declare
    ``unaccepted_draft`` for it, and the default accept-length floor applies. A truncated copy
    (``--standalone-layers K`` < the target's layers: the first K layers, the target's embedding, norm and
    head) is a smaller draft but, on a random target, an unaccepted one.

--check checks shapes, the d2t/t2d maps, and the STANDALONE vocabulary and tokenizer. With --sglang-src SITE
(an unpacked .sglang-stage/site.tar.xz) it also runs SGLang's OWN code on the CPU, without importing SGLang
(its imports need CUDA kernels and cp312 builds): ``LlamaForCausalLMEagle3.load_weights`` from
sglang/srt/models/llama_eagle3.py against the parameters its ``__init__`` creates for this config (transcribed
below: the names and shapes of ``EAGLE3_PARAMS``), with weight loaders that check each (shard's) shape --
every parameter but the embedding (the target's) must be loaded, since load_weights silently skips a name it
does not know --, and ``Qwen3ForCausalLM.set_eagle3_layers_to_capture`` from models/qwen3.py with qwen2.py's
capture loop, for the configured layer ids, which must capture as many states as fc reads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

SEED = 2525
AUX_LAYER_IDS = [0, 1, 2]      # target layers whose outputs the EAGLE-3 head reads (low, mid, high)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


def write_json(path: str, obj: object) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)


def head_config(tcfg: dict, architecture: str, **extra: object) -> dict:
    """A one-layer Llama-style draft head's config.json over the target's sizes, rope and vocabulary."""
    hidden, heads = tcfg["hidden_size"], tcfg["num_attention_heads"]
    return {
        "architectures": [architecture], "model_type": "llama", "vocab_size": tcfg["vocab_size"],
        "hidden_size": hidden, "intermediate_size": tcfg["intermediate_size"], "num_hidden_layers": 1,
        "num_attention_heads": heads, "num_key_value_heads": tcfg["num_key_value_heads"],
        "head_dim": tcfg.get("head_dim") or hidden // heads, "hidden_act": tcfg.get("hidden_act", "silu"),
        "max_position_embeddings": tcfg["max_position_embeddings"], "rms_norm_eps": tcfg["rms_norm_eps"],
        "rope_theta": tcfg["rope_theta"], "rope_scaling": None, "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": tcfg.get("bos_token_id"),
        "eos_token_id": tcfg.get("eos_token_id"), "pretraining_tp": 1, "use_cache": True, **extra,
    }


def eagle3(target: str, out: str, draft_vocab: int) -> dict:
    tcfg = read_json(os.path.join(target, "config.json"))
    vocab, hidden, inter = tcfg["vocab_size"], tcfg["hidden_size"], tcfg["intermediate_size"]
    heads, kv = tcfg["num_attention_heads"], tcfg["num_key_value_heads"]
    head_dim = tcfg.get("head_dim") or hidden // heads
    if not 0 < draft_vocab <= vocab:
        raise SystemExit(f"--draft-vocab {draft_vocab}: must be in 1..{vocab} (the target's vocab_size)")
    if max(AUX_LAYER_IDS) >= tcfg["num_hidden_layers"]:
        raise SystemExit(f"the target has {tcfg['num_hidden_layers']} layers; the head reads layers "
                         f"{AUX_LAYER_IDS}")
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(SEED)

    def rnd(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    cfg = head_config(tcfg, "LlamaForCausalLMEagle3", draft_vocab_size=draft_vocab, target_hidden_size=hidden,
                      eagle_config={"eagle_aux_hidden_state_layer_ids": AUX_LAYER_IDS,
                                    "use_aux_hidden_state": True})
    write_json(os.path.join(out, "config.json"), cfg)
    p = "midlayer."
    w = {
        "fc.weight": rnd(hidden, hidden * len(AUX_LAYER_IDS)),
        p + "hidden_norm.weight": ones(hidden), p + "input_layernorm.weight": ones(hidden),
        p + "post_attention_layernorm.weight": ones(hidden),
        p + "self_attn.q_proj.weight": rnd(heads * head_dim, 2 * hidden),
        p + "self_attn.k_proj.weight": rnd(kv * head_dim, 2 * hidden),
        p + "self_attn.v_proj.weight": rnd(kv * head_dim, 2 * hidden),
        p + "self_attn.o_proj.weight": rnd(hidden, heads * head_dim),
        p + "mlp.gate_proj.weight": rnd(inter, hidden), p + "mlp.up_proj.weight": rnd(inter, hidden),
        p + "mlp.down_proj.weight": rnd(hidden, inter),
        "norm.weight": ones(hidden),
        "lm_head.weight": rnd(draft_vocab, hidden, std=0.5),
    }
    # draft id i -> target id hot[i]
    hot = torch.sort(torch.randperm(vocab, generator=g)[:draft_vocab]).values
    if draft_vocab < vocab:
        w["d2t"] = hot - torch.arange(draft_vocab)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[hot] = True
        w["t2d"] = t2d
    save_file(w, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    return {"dir": out, "draft_vocab_size": draft_vocab, "aux_layer_ids": AUX_LAYER_IDS,
            "tensors": sorted(w), "hot_token_ids_head": hot[:8].tolist() if draft_vocab < vocab else None}


def eagle(target: str, out: str) -> dict:
    tcfg = read_json(os.path.join(target, "config.json"))
    vocab, hidden, inter = tcfg["vocab_size"], tcfg["hidden_size"], tcfg["intermediate_size"]
    heads, kv = tcfg["num_attention_heads"], tcfg["num_key_value_heads"]
    head_dim = tcfg.get("head_dim") or hidden // heads
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(SEED + 1)

    def rnd(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    cfg = head_config(tcfg, "LlamaForCausalLMEagle")
    write_json(os.path.join(out, "config.json"), cfg)
    p = "layers.0."
    w = {
        "embed_tokens.weight": rnd(vocab, hidden),
        "fc.weight": rnd(hidden, 2 * hidden), "fc.bias": torch.zeros(hidden, dtype=torch.bfloat16),
        p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        p + "self_attn.q_proj.weight": rnd(heads * head_dim, hidden),
        p + "self_attn.k_proj.weight": rnd(kv * head_dim, hidden),
        p + "self_attn.v_proj.weight": rnd(kv * head_dim, hidden),
        p + "self_attn.o_proj.weight": rnd(hidden, heads * head_dim),
        p + "mlp.gate_proj.weight": rnd(inter, hidden), p + "mlp.up_proj.weight": rnd(inter, hidden),
        p + "mlp.down_proj.weight": rnd(hidden, inter),
    }
    save_file(w, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    return {"dir": out, "tensors": sorted(w)}


def standalone(target: str, out: str, layers: int | None) -> dict:
    tcfg = read_json(os.path.join(target, "config.json"))
    n = tcfg["num_hidden_layers"]
    layers = n if layers is None else layers
    if not 0 < layers <= n:
        raise SystemExit(f"--standalone-layers {layers}: must be in 1..{n}")
    os.makedirs(out, exist_ok=True)
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(target, name)):
            shutil.copyfile(os.path.join(target, name), os.path.join(out, name))
    tw = load_file(os.path.join(target, "model.safetensors"))
    keep = {}
    for name, tensor in tw.items():
        if name.startswith("model.layers.") and int(name.split(".")[2]) >= layers:
            continue
        keep[name] = tensor.clone()
    cfg = dict(tcfg, num_hidden_layers=layers)
    if "max_window_layers" in cfg:
        cfg["max_window_layers"] = layers
    write_json(os.path.join(out, "config.json"), cfg)
    save_file(keep, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    return {"dir": out, "layers": layers, "target_layers": n, "exact_copy": layers == n}


def check(target: str, out: str) -> list[str]:
    """What SGLang 0.5.17 would refuse, checked without it: shapes, names, vocab and tokenizer identity."""
    problems = []
    tcfg = read_json(os.path.join(target, "config.json"))
    ecfg = read_json(os.path.join(out, "eagle3", "config.json"))
    ew = load_file(os.path.join(out, "eagle3", "model.safetensors"))
    h = tcfg["hidden_size"]
    aux = len(ecfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    if ew["fc.weight"].shape != (ecfg["hidden_size"], h * aux):
        problems.append(f"fc.weight {tuple(ew['fc.weight'].shape)}")
    if ew["midlayer.self_attn.q_proj.weight"].shape[1] != 2 * ecfg["hidden_size"]:
        problems.append("q_proj does not read 2*hidden (embedding + fc output)")
    if ew["lm_head.weight"].shape[0] != ecfg["draft_vocab_size"]:
        problems.append("lm_head rows != draft_vocab_size")
    if "d2t" in ew:
        hot = ew["d2t"] + torch.arange(ew["d2t"].shape[0])
        if hot.min() < 0 or hot.max() >= tcfg["vocab_size"] or len(set(hot.tolist())) != hot.shape[0]:
            problems.append("d2t does not map draft ids to distinct target ids")
        if int(ew["t2d"].sum()) != ecfg["draft_vocab_size"] or not bool(ew["t2d"][hot].all()):
            problems.append("t2d does not mark exactly the hot target ids")
    problems += check_eagle(tcfg, out)
    scfg = read_json(os.path.join(out, "standalone", "config.json"))
    if scfg["vocab_size"] != tcfg["vocab_size"]:
        problems.append("standalone vocab_size differs from the target's (STANDALONE refuses it)")
    tokenizer = read_text(os.path.join(out, "standalone", "tokenizer.json"))
    if tokenizer != read_text(os.path.join(target, "tokenizer.json")):
        problems.append("standalone tokenizer differs from the target's (STANDALONE refuses it)")
    sw = load_file(os.path.join(out, "standalone", "model.safetensors"))
    tw = load_file(os.path.join(target, "model.safetensors"))
    exact = set(sw) == set(tw) and all(torch.equal(sw[k], tw[k]) for k in tw)
    if scfg["num_hidden_layers"] == tcfg["num_hidden_layers"] and not exact:
        problems.append("standalone is not an exact copy of the target")
    return problems


def eagle_params(cfg: dict) -> dict[str, tuple[int, ...]]:
    """The parameters LlamaForCausalLMEagle.__init__ (SGLang 0.5.17, llama_eagle.py) creates for `cfg`, as
    named_parameters() names them (layer 0 has no input_layernorm, the model no final norm)."""
    h, i, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    layer = "model.layers.0."
    return {
        "model.embed_tokens.weight": (cfg["vocab_size"], h), "model.fc.weight": (h, 2 * h),
        "model.fc.bias": (h,),
        layer + "self_attn.qkv_proj.weight": ((heads + 2 * kv) * hd, h),
        layer + "self_attn.o_proj.weight": (h, heads * hd), layer + "mlp.gate_up_proj.weight": (2 * i, h),
        layer + "mlp.down_proj.weight": (h, i), layer + "post_attention_layernorm.weight": (h,),
        "lm_head.weight": (cfg["vocab_size"], h),
    }


# checkpoint name part -> (stacked parameter part, shard): LlamaForCausalLM.load_weights' stacking
# (model_loader/auto_loader.py STANDARD_GATE_UP_MAPPING)
STACKED = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
           "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def check_eagle(tcfg: dict, out: str) -> list[str]:
    """The EAGLE (v1) head against the parameters SGLang creates for it: every checkpoint name, once
    `model.`-prefixed and stacked, is a parameter with a fitting shape, and every parameter but the shared
    embedding and head is loaded."""
    problems: list[str] = []
    cfg = read_json(os.path.join(out, "eagle", "config.json"))
    if cfg["hidden_size"] != tcfg["hidden_size"] or cfg["vocab_size"] != tcfg["vocab_size"]:
        problems.append("eagle head: hidden_size / vocab_size differ from the target's "
                        "(shared embed and head)")
    params = eagle_params(cfg)
    hd, heads, kv, inter = (cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
                            cfg["intermediate_size"])
    shard_rows = {"q": heads * hd, "k": kv * hd, "v": kv * hd, 0: inter, 1: inter}
    loaded: dict[str, set] = {}
    for name, tensor in load_file(os.path.join(out, "eagle", "model.safetensors")).items():
        full = name if "lm_head" in name else "model." + name
        part = next((p for p in STACKED if f".{p}." in full), None)
        if part is not None:
            stacked, shard = STACKED[part]
            full = full.replace(part, stacked)
            want = (shard_rows[shard], params.get(full, (0, 0))[1])
        else:
            shard, want = None, params.get(full)
        if full not in params:
            problems.append(f"eagle head: {name} is no parameter of LlamaForCausalLMEagle "
                            "(load_weights skips it)")
        elif tuple(tensor.shape) != want:
            problems.append(f"eagle head: {name} has shape {tuple(tensor.shape)}, expected {want}")
        loaded.setdefault(full, set()).add(shard)
    for name in params:
        want = {"q", "k", "v"} if "qkv_proj" in name else {0, 1} if "gate_up_proj" in name else {None}
        if name not in ("model.embed_tokens.weight", "lm_head.weight") and loaded.get(name) != want:
            problems.append(f"eagle head: {name} not fully loaded "
                            f"({sorted(map(str, loaded.get(name, ())))})")
    return problems


def eagle3_params(cfg: dict) -> dict[str, tuple[int, ...]]:
    """The parameters LlamaForCausalLMEagle3.__init__ (SGLang 0.5.17) creates for `cfg`, as named_parameters()
    names them: LlamaModel (embed_tokens, fc, layers.0 with qkv_proj over 2*hidden, gate_up_proj, hidden_norm;
    norm) and the draft's own lm_head (draft_vocab_size rows; no fc_norm / input_norm: the config asks for
    none)."""
    h, i, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    aux = len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    layer = "model.layers.0."
    return {
        "model.embed_tokens.weight": (cfg["vocab_size"], h),
        "model.fc.weight": (h, cfg["target_hidden_size"] * aux),
        layer + "self_attn.qkv_proj.weight": ((heads + 2 * kv) * hd, 2 * h),
        layer + "self_attn.o_proj.weight": (h, heads * hd), layer + "mlp.gate_up_proj.weight": (2 * i, h),
        layer + "mlp.down_proj.weight": (h, i), layer + "input_layernorm.weight": (h,),
        layer + "post_attention_layernorm.weight": (h,), layer + "hidden_norm.weight": (h,),
        "model.norm.weight": (h,), "lm_head.weight": (cfg["draft_vocab_size"], h),
    }


def _method(path: str, cls: str, name: str, namespace: dict):
    """One method of one class of an SGLang source file, compiled alone (nothing else of SGLang imported)."""
    import ast
    import typing

    tree = ast.parse(read_text(path), path)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == name)
    ns = {"torch": torch, **{k: getattr(typing, k) for k in ("Iterable", "Tuple", "List", "Optional")},
          **namespace}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), ns)
    return ns[name]


def check_with_sglang(site: str, target: str, out: str) -> list[str]:
    """SGLang 0.5.17's own load_weights and capture-layer code run on the EAGLE-3 head (see the module
    doc)."""
    import types

    problems: list[str] = []
    cfg = read_json(os.path.join(out, "eagle3", "config.json"))
    tcfg = read_json(os.path.join(target, "config.json"))
    shapes = eagle3_params(cfg)
    loaded: dict[str, set] = {}
    h, hd, heads, kv, inter = cfg["hidden_size"], cfg["head_dim"], cfg["num_attention_heads"], \
        cfg["num_key_value_heads"], cfg["intermediate_size"]
    shard_shapes = {"q": (heads * hd, 2 * h), "k": (kv * hd, 2 * h), "v": (kv * hd, 2 * h),
                    0: (inter, h), 1: (inter, h)}

    def default_weight_loader(param, weight):
        if tuple(weight.shape) != param.shape:
            problems.append(f"{param.name}: checkpoint shape {tuple(weight.shape)}, parameter {param.shape}")
        loaded.setdefault(param.name, set()).add(None)

    def stacked_loader(param, weight, shard_id):
        if tuple(weight.shape) != shard_shapes[shard_id]:
            problems.append(f"{param.name}[{shard_id}]: checkpoint shape {tuple(weight.shape)}, "
                            f"shard {shard_shapes[shard_id]}")
        loaded.setdefault(param.name, set()).add(shard_id)

    params = {}
    for name, shape in shapes.items():
        stacked = "qkv_proj" in name or "gate_up_proj" in name
        loader = {"weight_loader": stacked_loader} if stacked else {}
        params[name] = types.SimpleNamespace(name=name, shape=shape, **loader)
    model = types.SimpleNamespace(named_parameters=lambda: list(params.items()), hot_token_id=None)
    src = os.path.join(site, "sglang", "srt", "models")
    load_weights = _method(os.path.join(src, "llama_eagle3.py"), "LlamaForCausalLMEagle3", "load_weights",
                           {"default_weight_loader": default_weight_loader})
    load_weights(model, load_file(os.path.join(out, "eagle3", "model.safetensors")).items())
    for name in shapes:
        want = {"q", "k", "v"} if "qkv_proj" in name else {0, 1} if "gate_up_proj" in name else {None}
        if name == "model.embed_tokens.weight":
            continue  # the target's embedding (EAGLE worker set_embed)
        if loaded.get(name) != want:
            problems.append(f"{name}: loaded {sorted(map(str, loaded.get(name, ())))}, needs "
                            f"{sorted(map(str, want))}")
    if cfg["draft_vocab_size"] < cfg["vocab_size"]:
        hot = model.hot_token_id
        if hot is None or hot.shape[0] != cfg["draft_vocab_size"] or int(hot.max()) >= tcfg["vocab_size"]:
            problems.append(f"hot_token_id after load_weights: {None if hot is None else tuple(hot.shape)}")

    # Capture layers: Qwen3ForCausalLM.set_eagle3_layers_to_capture, then qwen2.py's loop
    # `for i in range(start, end): if i in layers_to_capture: aux.append(...)`.
    capture = _method(os.path.join(src, "qwen3.py"), "Qwen3ForCausalLM", "set_eagle3_layers_to_capture", {})
    reads = len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    for ids, must in ((cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"], True), (None, False)):
        fake = types.SimpleNamespace(pp_group=types.SimpleNamespace(is_last_rank=True),
                                     model=types.SimpleNamespace(),
                                     config=types.SimpleNamespace(num_hidden_layers=tcfg["num_hidden_layers"]))
        capture(fake, ids)
        n = sum(1 for i in range(tcfg["num_hidden_layers"]) if i in fake.model.layers_to_capture)
        fits = n * tcfg["hidden_size"] == shapes["model.fc.weight"][1]
        print(json.dumps({"eagle_aux_hidden_state_layer_ids": ids,
                          "layers_to_capture": fake.model.layers_to_capture, "captured_states": n,
                          "fc_reads": reads, "fits": fits}), file=sys.stderr)
        if must and not fits:
            problems.append(f"the target captures {n} hidden states for layer ids {ids}; fc reads "
                            f"{shapes['model.fc.weight'][1] // tcfg['hidden_size']}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", help="the target model directory (make_models.py's OUTDIR/target)")
    ap.add_argument("outdir", help="writes OUTDIR/eagle, OUTDIR/eagle3 and OUTDIR/standalone")
    ap.add_argument("--draft-vocab", type=int, default=512,
                    help="the EAGLE-3 head's reduced vocabulary (default 512 of the target's 1024, with "
                         "d2t/t2d); the target's vocab_size: a full head, no d2t/t2d")
    ap.add_argument("--standalone-layers", type=int, default=None,
                    help="layers of the STANDALONE draft (default: all: an exact copy, the perfect draft)")
    ap.add_argument("--check", action="store_true",
                    help="check the outputs' shapes, maps, vocab and tokenizer")
    ap.add_argument("--sglang-src", default=None,
                    help="with --check: an unpacked SGLang site (sglang/srt/models/...): run its "
                         "load_weights and capture-layer code on the EAGLE-3 head")
    args = ap.parse_args(argv)
    torch.manual_seed(SEED)
    info = {"eagle": eagle(args.target, os.path.join(args.outdir, "eagle")),
            "eagle3": eagle3(args.target, os.path.join(args.outdir, "eagle3"), args.draft_vocab),
            "standalone": standalone(args.target, os.path.join(args.outdir, "standalone"),
                                     args.standalone_layers)}
    if args.check:
        info["problems"] = check(args.target, args.outdir)
        if args.sglang_src:
            info["problems"] += check_with_sglang(args.sglang_src, args.target, args.outdir)
    print(json.dumps(info))
    return 1 if info.get("problems") else 0


if __name__ == "__main__":
    sys.exit(main())
