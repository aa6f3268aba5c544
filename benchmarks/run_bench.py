"""Measure our load generator, GuideLLM and AIPerf side by side against pytest_dflash/refserver/synthetic.py.

Two experiments, every tool in the same run, repetitions interleaved (rep 1 of every tool, then
rep 2 …) so that machine noise lands on all tools alike:

* ``accuracy``: server TTFT 50 ms, ITL 10 ms, 128 tokens; concurrency 8. Each tool's TTFT p50/p99
  and output tok/s against what the server measured for the same requests (``/stats``).
* ``capacity``: server TTFT = ITL = 0, 256 tokens (the whole stream in one write): the most
  tokens/s a client can take, and tokens per client CPU-second — CPU of the client's whole process
  tree from /proc, over the "active window" (0.5 s samples in which the server's token counter grew).

Before each run it waits (bounded) for a quiet machine and records the load average. GuideLLM and
AIPerf live in side venvs outside the repo (see benchmarks/README.md); CI never runs this.

    .venv/bin/python benchmarks/run_bench.py --reps 3 --out benchmarks/.work/results
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TICK = os.sysconf("SC_CLK_TCK")
VENVS = Path(os.environ.get("BENCH_VENVS", "/work/bench-venvs"))
MODEL = "synth-model"


# -- machine state --------------------------------------------------------------------------------


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def cpu_busy(sample_s: float = 2.0) -> float:
    """Fraction of all cores busy over ``sample_s`` (from /proc/stat)."""

    def read() -> tuple[int, int]:
        vals = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = vals[3] + vals[4]
        return sum(vals), idle

    t1, i1 = read()
    time.sleep(sample_s)
    t2, i2 = read()
    return 1.0 - (i2 - i1) / max(t2 - t1, 1)


def wait_quiet(max_busy: float = 0.2, timeout_s: float = 60.0) -> dict[str, float]:
    """Wait (bounded) until the machine is at most ``max_busy`` busy; return what was seen."""
    start = time.monotonic()
    busy = cpu_busy()
    while busy > max_busy and time.monotonic() - start < timeout_s:
        busy = cpu_busy()
    return {"busy_before": round(busy, 3), "loadavg_before": loadavg(),
            "waited_s": round(time.monotonic() - start, 1)}


def proc_ticks(pid: int, *, with_children: bool) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if with_children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime (reaped children)
    return ticks


def tree_ticks(root: int) -> int:
    """CPU ticks of ``root`` (with reaped children) and of all its live descendants."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parts = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = int(parts[1])
    tree, frontier = {root}, [root]
    while frontier:
        p = frontier.pop()
        for child, parent in parents.items():
            if parent == p and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(proc_ticks(p, with_children=(p == root)) for p in tree)


def http_json(url: str, method: str = "GET", timeout: float = 5.0) -> Any:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


# -- server ---------------------------------------------------------------------------------------


class Server:
    """pytest_dflash/refserver/synthetic.py in its own process group, killed on exit."""

    def __init__(self, *args: str) -> None:
        cmd = [sys.executable, "-m", "pytest_dflash.refserver.synthetic", "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("LISTENING"):
            self.close()
            raise RuntimeError(f"synth server did not start: {line!r}")
        self.port = int(line.split()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- tools ----------------------------------------------------------------------------------------


@dataclass
class Tool:
    name: str
    command: Callable[[str, int, float, int, Path], list[str]]
    env: Callable[[], dict[str, str]]
    metrics: Callable[[Path], dict[str, Any]]
    warmup: int = 0


def _ours_cmd(stock: bool, warmup: int) -> Callable[[str, int, float, int, Path], list[str]]:
    def cmd(url: str, conc: int, dur: float, out_len: int, out: Path) -> list[str]:
        c = [sys.executable, "-m", "pytest_dflash.load", url, "--model", MODEL, "--concurrency", str(conc),
             "--duration", str(dur), "--prompt-len", "128", "--output-len", str(out_len), "--warmup",
             str(warmup), "--out", str(out / "ours.json"), "--no-records"]
        return c + (["--stock-httpx"] if stock else [])
    return cmd


def _ours_metrics(out: Path) -> dict[str, Any]:
    d = json.loads((out / "ours.json").read_text())
    return {"tok_s": d["output_throughput"], "ttft_p50": d["median_ttft_ms"], "ttft_p99": d["p99_ttft_ms"],
            "itl_mean": d["mean_itl_ms"], "completed": d["completed"], "failed": d["failed"],
            "client_saturated": d["client_saturated"], "saturation": d["saturation"]}


def _guidellm_cmd(url: str, conc: int, dur: float, out_len: int, out: Path) -> list[str]:
    tok = HERE / ".work" / "tokenizer"
    return [str(VENVS / "guidellm/bin/guidellm"), "run",
            "--backend", f"kind=openai_http,target={url},model={MODEL},request_format=/v1/chat/completions",
            "--profile", f"kind=concurrent,streams={conc}", "--constraint",
            f"kind=max_duration,seconds={dur:g}", "--tokenizer", f"kind=hf_auto,model={tok}",
            "--data", f"kind=synthetic_text,prompt_tokens=128,output_tokens={out_len}",
            "--output", f"kind=json,path={out / 'guidellm.json'}", "--disable-progress"]


def _guidellm_metrics(out: Path) -> dict[str, Any]:
    m = json.loads((out / "guidellm.json").read_text())["benchmarks"][0]["metrics"]
    ttft = m["time_to_first_token_ms"]["successful"]["percentiles"]
    return {"tok_s": m["output_tokens_per_second"]["successful"]["mean"], "ttft_p50": ttft["p50"],
            "ttft_p99": ttft["p99"], "itl_mean": m["inter_token_latency_ms"]["successful"]["mean"]}


def _aiperf_cmd(url: str, conc: int, dur: float, out_len: int, out: Path) -> list[str]:
    return [str(VENVS / "aiperf/bin/aiperf"), "profile", "--model", MODEL, "--url", url,
            "--endpoint-type", "chat", "--streaming", "--concurrency", str(conc), "--benchmark-duration",
            f"{dur:g}", "--prompt-input-tokens-mean", "128", "--prompt-output-tokens-mean", str(out_len),
            "--tokenizer", str(HERE / ".work" / "tokenizer"), "--ui", "none", "--output-artifact-dir",
            str(out)]


def _aiperf_metrics(out: Path) -> dict[str, Any]:
    d = json.loads((out / "profile_export_aiperf.json").read_text())
    return {"tok_s": d["output_token_throughput"]["avg"], "ttft_p50": d["time_to_first_token"]["p50"],
            "ttft_p99": d["time_to_first_token"]["p99"], "itl_mean": d["inter_token_latency"]["avg"]}


def _env_plain() -> dict[str, str]:
    return dict(os.environ)


def _env_guidellm() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _env_aiperf() -> dict[str, str]:  # AIPerf 0.13.0 cannot load a local tokenizer dir with these set
    return {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}


def tools(warmup: int) -> dict[str, Tool]:
    return {
        "ours": Tool("ours", _ours_cmd(False, warmup), _env_plain, _ours_metrics, warmup),
        "ours-stock-httpx": Tool("ours-stock-httpx", _ours_cmd(True, warmup), _env_plain,
                                 _ours_metrics, warmup),
        "guidellm": Tool("guidellm", _guidellm_cmd, _env_guidellm, _guidellm_metrics),
        "aiperf": Tool("aiperf", _aiperf_cmd, _env_aiperf, _aiperf_metrics),
    }


# -- one run --------------------------------------------------------------------------------------


def run_one(tool: Tool, server: Server, conc: int, dur: float, out_len: int, out: Path,
            limit_s: float) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    quiet = wait_quiet()
    http_json(f"{server.url}/stats/reset?skip={tool.warmup}", "POST")
    cmd = tool.command(server.url, conc, dur, out_len, out)
    (out / "command.txt").write_text(" ".join(cmd) + "\n")
    log = (out / "stdout.txt").open("w")
    t_start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=tool.env(), cwd=REPO,
                            start_new_session=True)
    samples: list[tuple[float, int, int, int]] = []  # t, server tokens, client ticks, server ticks
    try:
        while proc.poll() is None:
            if time.monotonic() - t_start > limit_s:
                os.killpg(proc.pid, signal.SIGKILL)
                break
            tokens = http_json(f"{server.url}/counters")["tokens"]
            samples.append((time.monotonic(), tokens, tree_ticks(proc.pid), proc_ticks(server.proc.pid,
                                                                                      with_children=False)))
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait(timeout=30)
        log.close()
    wall = time.monotonic() - t_start
    active_dt = active_tok = active_client = active_server = 0.0
    for (t1, k1, c1, s1), (t2, k2, c2, s2) in itertools.pairwise(samples):
        if k2 > k1:
            active_dt += t2 - t1
            active_tok += k2 - k1
            active_client += (c2 - c1) / TICK
            active_server += (s2 - s1) / TICK
    row: dict[str, Any] = {"tool": tool.name, "conc": conc, "rc": rc, "wall_s": round(wall, 1), **quiet}
    row["server_tok_s"] = active_tok / active_dt if active_dt else 0.0
    row["client_cores"] = active_client / active_dt if active_dt else 0.0
    row["server_cores"] = active_server / active_dt if active_dt else 0.0
    row["tok_per_client_cpu_s"] = active_tok / active_client if active_client else 0.0
    row["server_stats"] = http_json(f"{server.url}/stats")
    try:
        row["reported"] = tool.metrics(out)
    except (OSError, KeyError, ValueError, IndexError) as exc:
        row["reported"] = {"error": f"{type(exc).__name__}: {exc}"}
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / ".work" / "results"))
    ap.add_argument("--experiments", default="accuracy,capacity")
    ap.add_argument("--tools", default="ours,ours-stock-httpx,guidellm,aiperf")
    ap.add_argument("--acc-duration", type=float, default=20.0)
    ap.add_argument("--cap-duration", type=float, default=15.0)
    ap.add_argument("--cap-conc", default="8,32")
    ap.add_argument("--warmup", type=int, default=8,
                    help="our client's warm-up requests (excluded both sides)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    all_tools = tools(a.warmup)
    chosen = [all_tools[t] for t in a.tools.split(",")]
    for exp in a.experiments.split(","):
        if exp == "accuracy":
            server_args = ["--tokens", "128", "--ttft-ms", "50", "--itl-ms", "10"]
            concs, dur, out_len = [8], a.acc_duration, 128
        else:
            server_args = ["--tokens", "256", "--ttft-ms", "0", "--itl-ms", "0"]
            concs, dur, out_len = [int(c) for c in a.cap_conc.split(",")], a.cap_duration, 256
        results = out / f"{exp}.jsonl"
        with Server(*server_args) as server:
            for rep in range(1, a.reps + 1):
                for conc in concs:
                    for tool in chosen:
                        run_dir = out / "runs" / exp / f"{tool.name}_c{conc}_r{rep}"
                        row = run_one(tool, server, conc, dur, out_len, run_dir, limit_s=dur + 120)
                        row.update({"experiment": exp, "rep": rep})
                        with results.open("a") as fh:
                            fh.write(json.dumps(row) + "\n")
                        rep_ = row["reported"]
                        print(f"{exp} {tool.name} c={conc} r={rep}: rc={row['rc']} "
                              f"reported tok/s={rep_.get('tok_s')} server tok/s={row['server_tok_s']:.0f} "
                              f"client cores={row['client_cores']:.2f} load={row['loadavg_before']}",
                              flush=True)
    return 0


def summarize(rows: list[dict[str, Any]]) -> str:
    """Markdown tables (min / median / max over reps) for benchmarks/README.md."""

    def mmm(values: list[float], fmt: str) -> str:
        if not values:
            return "n/a"
        lo, med, hi = min(values), statistics.median(values), max(values)
        return f"{lo:{fmt}} / **{med:{fmt}}** / {hi:{fmt}}"

    lines: list[str] = []
    acc = [r for r in rows if r["experiment"] == "accuracy"]
    if acc:
        lines += ["| tool | reps ok | TTFT p50 err ms | TTFT p99 err ms | output tok/s err % | reported TTFT "
                  "p50 / p99 ms (median) | server TTFT p50 / p99 ms (median) | client CPU cores | "
                  "load avg before |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name in dict.fromkeys(r["tool"] for r in acc):
            rs = [r for r in acc if r["tool"] == name and r["rc"] == 0 and "tok_s" in r["reported"]]
            e50 = [r["reported"]["ttft_p50"] - r["server_stats"]["ttft_ms"]["p50"] for r in rs]
            e99 = [r["reported"]["ttft_p99"] - r["server_stats"]["ttft_ms"]["p99"] for r in rs]
            etok = [100 * (r["reported"]["tok_s"] / r["server_stats"]["tokens_per_s"] - 1) for r in rs]
            rep50 = statistics.median([r["reported"]["ttft_p50"] for r in rs]) if rs else 0.0
            rep99 = statistics.median([r["reported"]["ttft_p99"] for r in rs]) if rs else 0.0
            srv50 = statistics.median([r["server_stats"]["ttft_ms"]["p50"] for r in rs]) if rs else 0.0
            srv99 = statistics.median([r["server_stats"]["ttft_ms"]["p99"] for r in rs]) if rs else 0.0
            lines.append(
                f"| {name} | {len(rs)}/{len([r for r in acc if r['tool'] == name])} | {mmm(e50, '+.3f')} | "
                f"{mmm(e99, '+.3f')} | {mmm(etok, '+.3f')} | {rep50:.2f} / {rep99:.2f} | "
                f"{srv50:.2f} / {srv99:.2f} | {mmm([r['client_cores'] for r in rs], '.2f')} | "
                f"{mmm([r['loadavg_before'] for r in rs], '.2f')} |")
    cap = [r for r in rows if r["experiment"] == "capacity"]
    if cap:
        lines += ["", "| tool | conc | reps ok | tool-reported output tok/s | server-counted tok/s "
                      "(active window) | "
                  "client CPU cores | output tok per client CPU-s | server CPU cores | load avg before |",
                  "|---|---|---|---|---|---|---|---|---|"]
        keys = dict.fromkeys((r["tool"], r["conc"]) for r in cap)
        for name, conc in keys:
            rs = [r for r in cap if r["tool"] == name and r["conc"] == conc and r["rc"] == 0]
            total = len([r for r in cap if r["tool"] == name and r["conc"] == conc])
            lines.append(
                f"| {name} | {conc} | {len(rs)}/{total} | "
                f"{mmm([r['reported'].get('tok_s', 0.0) for r in rs], ',.0f')} | "
                f"{mmm([r['server_tok_s'] for r in rs], ',.0f')} | "
                f"{mmm([r['client_cores'] for r in rs], '.2f')} | "
                f"{mmm([r['tok_per_client_cpu_s'] for r in rs], ',.0f')} | "
                f"{mmm([r['server_cores'] for r in rs], '.2f')} | "
                f"{mmm([r['loadavg_before'] for r in rs], '.2f')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "summarize":
        base = Path(sys.argv[2] if len(sys.argv) > 2 else HERE / ".work" / "results")
        rows = [json.loads(line) for f in ("accuracy.jsonl", "capacity.jsonl") if (base / f).exists()
                for line in (base / f).read_text().splitlines() if line.strip()]
        print(summarize(rows))
        sys.exit(0)
    sys.exit(main())
