"""Probe: build FlashInfer JIT modules / a Triton kernel on a COLD cache and check they compute right.

Runs on the host under test with the server's python and the service's own environment; stdlib
at the top level, flashinfer / torch / triton inside the step child; never imports pytest_dflash.
Every run gets an EMPTY temporary FLASHINFER_WORKSPACE_BASE (and TRITON_CACHE_DIR), removed
afterwards, so a warm cache can hide nothing. The step runs in a child interpreter so a crash in
CUDA code cannot take the answer with it. Prints one JSON object:

    {"probe": "kernels", "step": "sampling", "mode": "run" | "compile", "ok": true,
     "workspace": "/tmp/dflash-jit-xxxx", "workspace_removed": true, "rc": 0, "seconds": 97.1,
     "timed_out": false, "built_files": ["sampling/sampling.so", ...], "stderr": "<tail>",
     "result": {                       # from the child; null when it died
        "flashinfer": {"version": "0.6.15.post1", "workspace_dir": ".../0.6.15.post1/90a",
                       "target_archs": [[9, "0a"]], "cuda_home": "/usr/local/cuda", "cuda_version": "13.0"},
        "module": "sampling", "error": null | {"phase": "spec" | "compile" | "link" | "load" | "run",
                                                "type": "RuntimeError", "message": "...", "traceback": "..."},
        "compile": {"ok": true, "seconds": 88.0, "targets": [...],
                    "objects": [{"output": "x.cuda.o", "seconds": 80.1}],
                    "log": "<ninja -v output, tail>", "ninja": "/venv/bin/ninja"},
        "link": {"ok": true, "seconds": 1.2, "log": ""} | null,
        "run": {...step specific numbers, see below...} | null}}

Steps: "sampling" (flashinfer.sampling.top_k_top_p_sampling_from_probs vs a torch reference of
the top-k then top-p set, plus a negative control that must violate it), "decode"
(flashinfer.single_decode_with_kv_cache vs torch scaled_dot_product_attention, GQA), "triton"
(a vector add compiled by Triton into an empty cache). Mode "compile" (hosts without a GPU) only
compiles (and links) for FLASHINFER_CUDA_ARCH_LIST; "objects" limits the compile to the named sources.

argv[1]: JSON {"step": "sampling", "mode": "run", "arch_list": null | "9.0", "objects": null | ["renorm"],
               "link": true, "jobs": null | 4, "timeout_s": 900}.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

MARK = "DFLASH-KERNELS "

CHILD = r'''
import json, os, re, shutil, subprocess, sys, time, traceback

MARK = "@@MARK@@"
params = json.loads(sys.argv[1])
step, mode = params["step"], params["mode"]
result = {"module": step, "spec_name": None, "flashinfer": None, "triton": None, "error": None,
          "compile": None, "link": None, "run": None}


def tail(text, limit=30000):
    text = text or ""
    return text if len(text) <= limit else "...\n" + text[-limit:]


def fail(phase, exc, log=None):
    result["error"] = {"phase": phase, "type": type(exc).__name__, "message": tail(str(exc), 20000),
                       "traceback": "\n".join(traceback.format_exc().strip().splitlines()[-40:])}
    if log:
        result["error"]["log"] = tail(log)


def emit():
    sys.stdout.write(MARK + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)


def ninja_objects(ninja_text, build_dir):
    """(output, source) of every compile edge in a FlashInfer build.ninja."""
    edges = []
    for line in ninja_text.splitlines():
        match = re.match(r"build (\S+): (cuda_compile|compile) (\S+)", line)
        if match:
            edges.append((match.group(1), match.group(3)))
    return edges


def object_times(build_dir):
    times = []
    try:
        with open(os.path.join(build_dir, ".ninja_log")) as handle:
            for line in handle:
                if line.startswith("#"):
                    continue
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 4:
                    times.append({"output": os.path.basename(parts[3]),
                                  "seconds": round((int(parts[1]) - int(parts[0])) / 1000.0, 3)})
    except OSError:
        pass
    return times


def build(spec):
    import flashinfer
    spec.write_ninja()
    build_dir = str(spec.build_dir)
    with open(spec.ninja_path) as handle:
        edges = ninja_objects(handle.read(), build_dir)
    wanted = params.get("objects")
    targets = [out for out, src in edges if not wanted or os.path.basename(src).split(".")[0] in wanted]
    ninja = shutil.which("ninja")
    info = {"ok": False, "seconds": 0.0, "targets": [os.path.basename(t) for t in targets], "objects": [],
            "log": "", "ninja": ninja}
    result["compile"] = info
    if wanted and not targets:
        info.update(ok=True, skipped=f"no source of {spec.name} is named {wanted}: "
                    + ", ".join(os.path.basename(src) for _, src in edges))
        return
    if ninja is None:
        raise FileNotFoundError("ninja is not on PATH: FlashInfer's JIT runs `ninja` from PATH")
    argv = [ninja, "-v", "-C", build_dir, "-f", str(spec.ninja_path)]
    jobs = params.get("jobs") or (int(os.environ["MAX_JOBS"]) if os.environ.get("MAX_JOBS", "").isdigit()
                                  else None)
    if jobs:
        argv += ["-j", str(jobs)]
    started = time.monotonic()
    done = subprocess.run(argv + targets, capture_output=True, text=True, errors="replace", cwd=build_dir)
    info.update(seconds=round(time.monotonic() - started, 3), objects=object_times(build_dir),
                log=tail(done.stdout + done.stderr), rc=done.returncode)
    if done.returncode != 0:
        raise RuntimeError(f"the JIT compile step failed: ninja exited {done.returncode} "
                           "(its output is the log)")
    info["ok"] = True
    if wanted or not params.get("link", True):
        return
    link = {"ok": False, "seconds": 0.0, "log": ""}
    result["link"] = link
    started = time.monotonic()
    try:
        spec.build(verbose=False)  # FlashInfer's own run_ninja: only the link is left to do
    except Exception as exc:
        link["log"] = tail(str(exc))
        raise
    finally:
        link["seconds"] = round(time.monotonic() - started, 3)
    link["ok"] = os.path.exists(str(spec.jit_library_path))


def flashinfer_facts():
    import flashinfer
    from flashinfer.jit import env as jit_env
    facts = {"version": getattr(flashinfer, "__version__", None),
             "workspace_dir": str(jit_env.FLASHINFER_WORKSPACE_DIR),
             "jit_dir": str(jit_env.FLASHINFER_JIT_DIR), "target_archs": None, "cuda_home": None,
             "cuda_version": None}
    result["flashinfer"] = facts
    try:
        from flashinfer.jit.core import current_compilation_context
        facts["target_archs"] = sorted([int(a), str(b)]
                                       for a, b in current_compilation_context.TARGET_CUDA_ARCHS)
    except Exception as exc:
        facts["target_archs_error"] = f"{type(exc).__name__}: {exc}"
    try:
        from flashinfer.jit import cpp_ext
        facts["cuda_home"] = str(cpp_ext.get_cuda_path())
        facts["cuda_version"] = str(cpp_ext.get_cuda_version())
    except Exception as exc:
        facts["cuda_error"] = f"{type(exc).__name__}: {exc}"


def run_sampling():
    import torch
    import flashinfer.sampling as fs
    torch.manual_seed(1234)
    rows, vocab, n, top_k, top_p = 8, 256, 4000, 16, 0.8
    logits = torch.randn(rows, vocab, device="cuda") * 2.5
    probs = torch.softmax(logits, dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    kept = sorted_p[:, :top_k] / sorted_p[:, :top_k].sum(dim=-1, keepdim=True)
    exclusive = kept.cumsum(dim=-1) - kept
    loose = torch.zeros_like(probs, dtype=torch.bool)
    loose.scatter_(1, order[:, :top_k], exclusive < top_p + 1e-4)
    strict = torch.zeros_like(probs, dtype=torch.bool)
    strict.scatter_(1, order[:, :top_k], exclusive < top_p - 1e-4)
    target = torch.where(strict, probs, torch.zeros_like(probs))
    target = target / target.sum(dim=-1, keepdim=True)
    batch = probs.repeat_interleave(n, dim=0)
    started = time.monotonic()
    samples = fs.top_k_top_p_sampling_from_probs(batch, top_k, top_p)
    torch.cuda.synchronize()
    first = time.monotonic() - started
    started = time.monotonic()
    fs.top_k_top_p_sampling_from_probs(batch, top_k, top_p)
    torch.cuda.synchronize()
    second = time.monotonic() - started
    samples = samples.view(rows, n).long()
    allowed = loose.gather(1, samples)
    violations = int((~allowed).sum())
    ones = torch.ones_like(samples, dtype=torch.float)
    counts = torch.zeros(rows, vocab, device="cuda").scatter_add_(1, samples, ones)
    empirical = counts / n
    tvd = (0.5 * (empirical - target).abs().sum(dim=-1)).tolist()
    control = torch.multinomial(probs, n, replacement=True)  # unfiltered: must leave the allowed set
    control_violations = int((~loose.gather(1, control)).sum())
    examples = []
    if violations:
        bad = (~allowed).nonzero()[:5].tolist()
        examples = [{"row": r, "token": int(samples[r, c]), "prob": float(probs[r, samples[r, c]])}
                    for r, c in bad]
    result["run"] = {"rows": rows, "vocab": vocab, "samples_per_row": n, "top_k": top_k, "top_p": top_p,
                     "allowed_sizes": loose.sum(dim=-1).tolist(), "violations": violations,
                     "violation_examples": examples, "tvd": [round(x, 5) for x in tvd],
                     "control_violations": control_violations, "first_call_s": round(first, 4),
                     "second_call_s": round(second, 4), "device": torch.cuda.get_device_name(0)}


def run_decode():
    import torch
    import torch.nn.functional as F
    import flashinfer
    torch.manual_seed(1234)
    qo_heads, kv_heads, head_dim, kv_len = 32, 8, 128, 1024
    q = torch.randn(qo_heads, head_dim, dtype=torch.float16, device="cuda")
    k = torch.randn(kv_len, kv_heads, head_dim, dtype=torch.float16, device="cuda")
    v = torch.randn(kv_len, kv_heads, head_dim, dtype=torch.float16, device="cuda")
    started = time.monotonic()
    out = flashinfer.single_decode_with_kv_cache(q, k, v)
    torch.cuda.synchronize()
    first = time.monotonic() - started
    group = qo_heads // kv_heads
    kk = k.transpose(0, 1).repeat_interleave(group, dim=0).unsqueeze(0).float()
    vv = v.transpose(0, 1).repeat_interleave(group, dim=0).unsqueeze(0).float()
    ref = F.scaled_dot_product_attention(q.view(1, qo_heads, 1, head_dim).float(), kk,
                                         vv).view(qo_heads, head_dim)
    err = (out.float() - ref).abs()
    wrong = F.scaled_dot_product_attention(q.view(1, qo_heads, 1, head_dim).float(), kk.flip(1), vv.flip(1))
    control = (out.float() - wrong.view(qo_heads, head_dim)).abs().max().item()
    result["run"] = {"qo_heads": qo_heads, "kv_heads": kv_heads, "head_dim": head_dim, "kv_len": kv_len,
                     "dtype": "float16", "max_abs_err": err.max().item(), "mean_abs_err": err.mean().item(),
                     "ref_max_abs": ref.abs().max().item(), "control_max_abs_err": control,
                     "first_call_s": round(first, 4), "device": torch.cuda.get_device_name(0)}


TRITON_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets,
             tl.load(x_ptr + offsets, mask=mask) * 2.0 + tl.load(y_ptr + offsets, mask=mask), mask=mask)
"""


def run_triton():
    import importlib
    import torch
    import triton
    result["triton"] = {"version": triton.__version__, "cache_dir": os.environ.get("TRITON_CACHE_DIR")}
    source_dir = os.path.join(os.environ["FLASHINFER_WORKSPACE_BASE"], "triton_src")
    os.makedirs(source_dir, exist_ok=True)
    with open(os.path.join(source_dir, "dflash_triton_probe.py"), "w") as handle:
        handle.write(TRITON_KERNEL)  # Triton reads the kernel's source file: it cannot come from -c
    sys.path.insert(0, source_dir)
    kernel = importlib.import_module("dflash_triton_probe").add_kernel
    n = 1 << 20
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    grid = (triton.cdiv(n, 1024),)
    started = time.monotonic()
    try:
        kernel[grid](x, y, out, n, BLOCK=1024)
        torch.cuda.synchronize()
    except Exception as exc:
        result["compile"] = {"ok": False, "seconds": round(time.monotonic() - started, 3),
                             "log": tail(str(exc))}
        raise
    first = time.monotonic() - started
    started = time.monotonic()
    kernel[grid](x, y, out, n, BLOCK=1024)
    torch.cuda.synchronize()
    second = time.monotonic() - started
    result["compile"] = {"ok": True, "seconds": round(first - second, 3), "log": ""}
    err = (out - (x * 2.0 + y)).abs().max().item()
    result["run"] = {"n": n, "max_abs_err": err, "first_call_s": round(first, 4),
                     "second_call_s": round(second, 4), "device": torch.cuda.get_device_name(0)}


def main():
    phase = "import"
    try:
        if step == "triton":
            phase = "compile"
            run_triton()
            return
        flashinfer_facts()
        phase = "spec"
        import torch
        if step == "sampling":
            from flashinfer.jit.sampling import gen_sampling_module
            spec = gen_sampling_module()
        elif step == "decode":
            from flashinfer.jit import gen_single_decode_module
            spec = gen_single_decode_module(torch.float16, torch.float16, torch.float16, 128, 128, 0, False,
                                            False)
        else:
            raise ValueError(f"unknown step {step!r}")
        result["spec_name"] = spec.name
        phase = "compile"
        try:
            build(spec)
        except Exception:
            if result["link"] is not None:
                phase = "link"
            raise
        if mode != "run":
            return
        phase = "run"
        if step == "sampling":
            run_sampling()
        else:
            run_decode()
    except BaseException as exc:
        fail(phase, exc, (result.get("compile") or {}).get("log") if phase == "compile" else None)


try:
    main()
finally:
    emit()
'''.replace("@@MARK@@", MARK)


def listing(root: str) -> list[str]:
    found = []
    for directory, _, files in os.walk(root):
        for name in files:
            if name.endswith((".so", ".o", ".cubin")):
                found.append(os.path.relpath(os.path.join(directory, name), root))
    return sorted(found)[:200]


def main() -> None:
    params = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    params.setdefault("step", "sampling")
    params.setdefault("mode", "run")
    timeout_s = float(params.get("timeout_s", 900))
    workspace = tempfile.mkdtemp(prefix="dflash-jit-")
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": workspace,
           "TRITON_CACHE_DIR": os.path.join(workspace, "triton")}
    if params.get("arch_list"):
        env["FLASHINFER_CUDA_ARCH_LIST"] = params["arch_list"]
    out: dict = {"probe": "kernels", "step": params["step"], "mode": params["mode"], "ok": False,
                 "workspace": workspace, "workspace_removed": False, "rc": None, "seconds": 0.0,
                 "timed_out": False, "built_files": [], "stderr": "", "result": None,
                 "env": {k: env.get(k) for k in ("CUDA_HOME", "CUDA_PATH", "CPATH",
                                                 "FLASHINFER_CUDA_ARCH_LIST", "CUDA_VISIBLE_DEVICES",
                                                 "MAX_JOBS")}}
    started = time.monotonic()
    try:
        try:
            done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(params)], capture_output=True,
                                  text=True, errors="replace", timeout=timeout_s, env=env,
                                  stdin=subprocess.DEVNULL, cwd=workspace)
            out.update(rc=done.returncode, stderr=done.stderr[-8000:])
            for line in reversed(done.stdout.splitlines()):
                if line.startswith(MARK):
                    out["result"] = json.loads(line[len(MARK):])
                    break
        except subprocess.TimeoutExpired as exc:
            stderr = (exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes)
                      else (exc.stderr or ""))
            out.update(timed_out=True, stderr=stderr[-8000:])
        out["built_files"] = listing(workspace)
    finally:
        out["seconds"] = round(time.monotonic() - started, 3)
        shutil.rmtree(workspace, ignore_errors=True)
        out["workspace_removed"] = not os.path.exists(workspace)
    out["ok"] = out["result"] is not None and out["result"]["error"] is None and out["rc"] == 0
    print(json.dumps(out))


if __name__ == "__main__":
    main()
