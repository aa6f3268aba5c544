#!/usr/bin/env python3
"""Wait for one SGLang server, send a few real requests, record what came back (JSON), standard library only.

    python3 probe_server.py --base http://127.0.0.1:30011 --pid PID --wait 300 --out probe.json [--label L]

Used by run_real_ddtree.sh for servers it starts itself (not through the plugin), e.g. the flashinfer-backend
DDTREE server that also warms the FlashInfer JIT cache for the plugin's later run. Records, with timings:
/server_info's speculative fields, a greedy and a sampled /generate (meta_info: spec_accept_length,
spec_verify_ct, ...), the same greedy prompt again (determinism) and a return_logprob request (the 4xx text).
Exit status 0 when the greedy and sampled requests answered, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.error
import urllib.request


def call(base: str, path: str, body: dict | None = None, timeout: float = 120.0) -> tuple[int, object, float]:
    t0 = time.time()
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read().decode(errors="replace")
            code = resp.status
    except urllib.error.HTTPError as exc:
        raw, code = exc.read().decode(errors="replace"), exc.code
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return -1, f"{type(exc).__name__}: {exc}", time.time() - t0
    try:
        parsed: object = json.loads(raw)
    except ValueError:
        parsed = raw[:2000]
    return code, parsed, time.time() - t0


def alive(pid: int | None) -> bool:
    if not pid:
        return True
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--pid", type=int, default=None)
    ap.add_argument("--wait", type=float, default=300)
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    t0 = time.time()
    rec: dict = {"label": args.label, "base": args.base, "probes": []}

    def probe(name: str, path: str, body: dict | None = None, timeout: float = 120.0):
        code, out, dt = call(args.base, path, body, timeout)
        rec["probes"].append({"name": name, "path": path, "body": body, "status": code,
                              "seconds": round(dt, 3), "response": out})
        return code, out

    ready = False
    while time.time() - t0 < args.wait:
        if not alive(args.pid):
            rec["died_at_s"] = round(time.time() - t0, 1)
            break
        code, _, _ = call(args.base, "/health", None, 5)
        if code == 200:
            ready = True
            break
        time.sleep(2)
    rec["http_up_s"] = round(time.time() - t0, 1) if ready else None
    ok = False
    if ready:
        prompt = "The quick brown fox"
        g1 = probe("greedy", "/generate",
                   {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 48}},
                   timeout=max(30.0, args.wait - (time.time() - t0)))
        rec["greedy_s"] = round(time.time() - t0, 1)
        s1 = probe("sampled", "/generate", {"text": prompt, "sampling_params": {
            "temperature": 0.8, "top_k": 20, "top_p": 0.9, "max_new_tokens": 32}},
            timeout=max(240.0, args.wait - (time.time() - t0)))  # run 1: a cold JIT took ~100 s here
        rec["sampled_s"] = round(time.time() - t0, 1)
        probe("greedy_again", "/generate",
              {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 48}})
        probe("server_info", "/server_info")
        probe("logprob", "/generate", {"text": prompt, "return_logprob": True,
                                       "sampling_params": {"temperature": 0, "max_new_tokens": 4}})
        ok = g1[0] == 200 and s1[0] == 200
        try:
            info = rec["probes"][3]["response"]
            rec["server_info"] = {k: info.get(k)
                                  for k in ("speculative_algorithm", "speculative_num_draft_tokens",
                                           "speculative_ddtree_budget", "attention_backend",
                                           "disable_cuda_graph", "disable_overlap_schedule",
                                           "version")} if isinstance(info, dict) else None
        except (IndexError, AttributeError):
            pass
        try:
            a, b = rec["probes"][0]["response"], rec["probes"][2]["response"]
            rec["greedy_deterministic"] = (a.get("output_ids", a.get("text"))
                                           == b.get("output_ids", b.get("text")))
            rec["greedy_meta"] = {k: v for k, v in a.get("meta_info", {}).items() if k.startswith("spec") or
                                  k in ("completion_tokens", "finish_reason")}
        except AttributeError:
            pass
    rec["ok"] = ok
    rec["total_s"] = round(time.time() - t0, 1)
    with open(args.out, "w") as f:
        json.dump(rec, f, indent=1, default=str)
    print(json.dumps({k: rec.get(k) for k in ("label", "ok", "http_up_s", "greedy_s", "sampled_s",
                                              "died_at_s", "greedy_deterministic", "greedy_meta",
                                              "server_info")}, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
