"""Fleet scale: what does the plugin's own orchestration cost when it tests many hosts at once?

32 host profiles (`connection = "local://"`, `kind = "external"` services with fixed URLs) share two
refservers started once (NONE and DFLASH), so no host provisions anything and the servers are shared: the
measurement is pytest + pytest-dflash + xdist, per host. It compares the smoke suite on the whole fleet with
the smoke suite on one of those hosts, both with `-n WORKERS`; records the CPU the shared servers spent during
each run (so a server bottleneck shows), the controller's and the workers' peak RSS (this file is also a
pytest plugin, loaded with `-p fleet_scale`, that reports ru_maxrss from every process), optionally a cProfile
of the controller and of each worker, and the cost of `pytest-dflash merge` on thousands of synthetic
verdicts.

    .venv/bin/python benchmarks/fleet_scale.py                # 32 hosts, -n 2, 3 repeats, merge of 5000
    .venv/bin/python benchmarks/fleet_scale.py --hosts 8 --repeat 1 --merge 0
    .venv/bin/python benchmarks/fleet_scale.py --profile      # + top functions of controller and workers
    .venv/bin/python benchmarks/fleet_scale.py --workers 2 --baseline-concurrency 1 --no-serial --merge 0
                                                              # A/B: each worker's hosts at once vs one by one
    .venv/bin/python benchmarks/fleet_scale.py --hosts 256 --workers 2 --repeat 1 --no-serial --merge 0
    .venv/bin/python benchmarks/fleet_scale.py --memo ...     # memo_proxy.py in front of each server:
                                                              # a repeated reproducible generation is free
    python3 benchmarks/fleet_scale.py --runner-cpus 0,1 --host-cpus 2-15 ...
                                    # a 2-core runner whose hosts' side runs on other CPUs of a bigger box
                                    # (tools/device/fleet_scale_pinned.sh runs it on the device)

Every server and pytest process it starts is stopped when it ends (also on Ctrl-C).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "suites" / "smoke"
MEM_ENV = "FLEET_SCALE_MEM"
PROFILE_ENV = "FLEET_SCALE_PROFILE"
POLL_ENV = "FLEET_SCALE_POLL_S"

# ---- the pytest plugin side (-p fleet_scale): peak memory and optional cProfile of every process --------


def pytest_configure(config: Any) -> None:
    if os.environ.get(POLL_ENV):  # what-if: the readiness watcher wakes up this often instead of every 0.25 s
        from pytest_dflash.services import readiness

        init = readiness.ReadinessWatcher.__init__

        def fast_poll(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            self.poll_s = float(os.environ[POLL_ENV])

        readiness.ReadinessWatcher.__init__ = fast_poll  # type: ignore[method-assign]
    if os.environ.get(PROFILE_ENV):
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
        config._fleet_scale_profiler = profiler


def pytest_unconfigure(config: Any) -> None:
    worker = getattr(config, "workerinput", {}).get("workerid", "controller")
    profiler = getattr(config, "_fleet_scale_profiler", None)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(os.path.join(os.environ[PROFILE_ENV], f"{worker}.prof"))
    path = os.environ.get(MEM_ENV)
    if path:
        rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"process": worker, "pid": os.getpid(),
                                     "maxrss_mib": rss_kib / 1024}) + "\n")


# ---- the benchmark -----------------------------------------------------------------------------------------


def profile_text(name: str, urls: dict[str, str], python: str | None = None) -> str:
    lines = ["[host]", 'connection = "local://"', *([f'python = "{python}"'] if python else []), ""]
    for service, algorithm in (("none", "NONE"), ("dflash", "DFLASH")):
        lines += [f"[services.{service}]", 'kind = "external"', f'algorithm = "{algorithm}"',
                  f'url = "{urls[service]}"', 'ready_timeout = "60s"', ""]
    lines += ["[parity]", 'reference = "none"', 'compare = ["dflash"]', 'plain = "none"', ""]
    return "\n".join(lines)


def server_cpu_s(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        for path in Path(f"/proc/{pid}/task").glob("*/stat"):
            try:
                fields = path.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


RUNNER_CPUS: set[int] | None = None  # --runner-cpus: pytest (controller, workers, what they spawn) runs here


def parse_cpus(text: str) -> set[int]:
    """'0,1' or '2-15' or '0,2-3' -> a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def host_python(work: Path, python: str, cpus: set[int] | None, *, gpu: bool = True) -> str:
    """The probes' host python as a wrapper: on `cpus` (the probes' interpreter starts on the host's CPUs, as
    it does on a fleet host reached over ssh; the runner pays for the shell and `taskset`, more than an ssh
    client with a shared connection would), and with `gpu=False` without nvidia-smi on its PATH: the hosts
    then have no GPU, as on this 2-core machine (on the device every host would query its one GPU's
    driver)."""
    wrapper = work / "host-python"
    env = ""
    if not gpu:
        (work / "no-gpu-bin").mkdir(exist_ok=True)
        env = f"PATH={work / 'no-gpu-bin'} "
    pin = f"{shutil.which('taskset') or 'taskset'} -c {','.join(map(str, sorted(cpus)))} " if cpus else ""
    wrapper.write_text(f"#!/bin/sh\n{env}exec {pin}{python} \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def run_pytest(fleet: Path, workers: int, work: Path, pids: list[int], *, profile_dir: Path | None = None,
               extra: tuple[str, ...] = ()) -> dict[str, Any]:
    mem = work / "mem.jsonl"
    mem.unlink(missing_ok=True)
    reports = work / "reports"
    shutil.rmtree(reports, ignore_errors=True)
    env = {**os.environ, MEM_ENV: str(mem), "PYTHONPATH": f"{Path(__file__).parent}{os.pathsep}"
           + os.environ.get("PYTHONPATH", "")}
    if profile_dir is not None:
        env[PROFILE_ENV] = str(profile_dir)
    command = [sys.executable, "-m", "pytest", str(SUITE), "-p", "fleet_scale", "-p",
               "no:cacheprovider", "-q", "--fleet", str(fleet), f"--dflash-report={reports}", "-n",
               str(workers), *extra]
    before_server = server_cpu_s(pids)
    before_each = [server_cpu_s([pid]) for pid in pids]
    before_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_before = load()
    started = time.perf_counter()
    pin = (lambda: os.sched_setaffinity(0, RUNNER_CPUS)) if RUNNER_CPUS else None
    result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=1800,
                            preexec_fn=pin)
    wall = time.perf_counter() - started
    after_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    tail = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-500:]
    processes = [json.loads(line) for line in mem.read_text().splitlines()] if mem.exists() else []
    controller = [p["maxrss_mib"] for p in processes if p["process"] == "controller"]
    worker_rss = [p["maxrss_mib"] for p in processes if p["process"] != "controller"]
    verdicts = list(reports.glob("*.verdict.json"))
    return {
        "wall_s": wall, "rc": result.returncode, "summary": tail, "verdicts": len(verdicts),
        "load_before": load_before, "load_after": load(),
        "pytest_cpu_s": (after_children.ru_utime + after_children.ru_stime)
        - (before_children.ru_utime + before_children.ru_stime),
        "server_cpu_s": server_cpu_s(pids) - before_server,
        # per server: one scheduler thread generates (refserver/scheduler.py), so the busiest bounds the wall
        "server_cpu_each_s": [round(server_cpu_s([pid]) - before, 2)
                              for pid, before in zip(pids, before_each, strict=True)],
        "controller_rss_mib": max(controller) if controller else None,
        "worker_rss_mib": max(worker_rss) if worker_rss else None,
        "worker_rss_all_mib": {p["process"]: round(p["maxrss_mib"], 1) for p in processes
                               if p["process"] != "controller"},
    }


def start_memo_proxy(upstream: str) -> tuple[subprocess.Popen[str], str]:
    """benchmarks/memo_proxy.py in front of `upstream`, and its URL (it prints LISTENING before anything
    else)."""
    proxy = subprocess.Popen([sys.executable, str(Path(__file__).with_name("memo_proxy.py")),
                              "--upstream", upstream],
                             stdout=subprocess.PIPE, text=True)
    line = proxy.stdout.readline() if proxy.stdout else ""
    if not line.startswith("LISTENING "):
        proxy.kill()
        raise SystemExit(f"memo_proxy did not start (exit {proxy.wait()}): {line!r}")
    return proxy, f"http://127.0.0.1:{int(line.split()[1])}"


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda r: r["wall_s"])
    chosen = dict(ordered[len(ordered) // 2])
    chosen["wall_all_s"] = [round(r["wall_s"], 2) for r in runs]
    for key in ("pytest_cpu_s", "server_cpu_s"):
        chosen[key.replace("_s", "_all_s")] = [round(r[key], 2) for r in runs]
    chosen["load_all"] = [f"{r['load_before']}->{r['load_after']}" for r in runs]
    return chosen


def top_functions(path: Path, count: int) -> list[str]:
    stats = pstats.Stats(str(path))
    rows = []
    for (filename, line, name), (_, _, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append((tottime, cumtime, f"{Path(filename).name}:{line}:{name}"))
    rows.sort(reverse=True)
    return [f"{tottime:7.2f}s self {cumtime:7.2f}s cum  {where}" for tottime, cumtime, where in rows[:count]]


def waiting_callers(path: Path, count: int) -> list[str]:
    """Who sleeps or waits on a socket: the callers of time.sleep / socket.recv and the time they spent
    there."""
    stats = pstats.Stats(str(path))
    rows = []
    for (_, _, name), (_, _, _, _, callers) in stats.stats.items():  # type: ignore[attr-defined]
        if name in ("<built-in method time.sleep>", "<method 'recv' of '_socket.socket' objects>",
                    "<method 'recv_into' of '_socket.socket' objects>"):
            wait = name.split()[1].strip("'>")
            for (filename, line, caller), (_, _, tottime, _) in callers.items():
                rows.append((tottime, f"{wait} from {Path(filename).name}:{line}:{caller}"))
    rows.sort(reverse=True)
    return [f"{seconds:7.2f}s {where}" for seconds, where in rows[:count]]


def merge_cost(template: dict[str, Any], count: int, work: Path) -> dict[str, Any]:
    """Synthetic verdicts (copies of a real one, 2 % failing), merged twice: cold, then with trend +
    history."""
    shards = work / "merge-in"
    shutil.rmtree(shards, ignore_errors=True)
    failing = copy.deepcopy(template)
    failing["verdict"] = "fail"
    failing["layers"]["service"] = {"outcome": "failed", "passed": 0, "failed": 1, "blocked": 0, "skipped": 0}
    failing["failures"] = [{"test": "suites/smoke/test_smoke.py::test_service_ready[x/dflash]",
                            "layer": "service", "phase": "call",
                            "message": "ServiceCrashed: service dflash died during readiness",
                            "diagnosis": [{"id": "flashinfer-sm12x-nvcc",
                                           "title": "FlashInfer …", "remedy": "…"}]}]
    started = time.perf_counter()
    for index in range(count):
        data = failing if index % 50 == 7 else template
        name = f"gpu-{index:05d}"
        shard = shards / f"shard-{index % 16:02d}"
        shard.mkdir(parents=True, exist_ok=True)
        text = json.dumps({**data, "host": name}, indent=2)
        (shard / f"{name}.verdict.json").write_text(text)
    written_s = time.perf_counter() - started
    out = work / "merge-out"
    shutil.rmtree(out, ignore_errors=True)
    timings = []
    # the merge in a fresh interpreter that reports its own peak RSS on its last stderr line
    code = ("import resource, sys; from pytest_dflash.cli import main; rc = main(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); sys.exit(rc)")
    for _ in range(2):
        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-c", code, "merge", str(shards), "--out", str(out), "-q"],
                                capture_output=True, text=True, timeout=1800)
        if result.returncode not in (0, 1):
            raise SystemExit(f"merge failed: {result.stderr}")
        timings.append({"wall_s": round(time.perf_counter() - started, 2), "rc": result.returncode,
                        "maxrss_mib": round(int(result.stderr.split()[-1]) / 1024, 1)})
    sizes = {p.name: round(p.stat().st_size / 1e6, 2) for p in sorted(out.iterdir()) if p.is_file()}
    input_mb = sum(p.stat().st_size for p in shards.rglob("*.json")) / 1e6
    return {"verdicts": count, "input_mb": round(input_mb, 1), "write_inputs_s": round(written_s, 2),
            "cold": timings[0], "with_trend_and_history": timings[1], "outputs_mb": sizes}


def compare(one: Path, many: Path, workers: int, repeat: int, work: Path, pids: list[int], hosts: int,
            label: str, *, baseline_concurrency: int = 0, one_host: bool = True) -> dict[str, Any]:
    single: list[dict[str, Any]] = []
    fleet: list[dict[str, Any]] = []
    baseline: list[dict[str, Any]] = []
    for _ in range(repeat):  # interleaved, so a change in the machine's load hits every variant alike
        if one_host:
            single.append(run_pytest(one, workers, work, pids))
        fleet.append(run_pytest(many, workers, work, pids))
        line = f"  {label}: {hosts} hosts {fleet[-1]['wall_s']:.2f}s"
        if baseline_concurrency:
            baseline.append(run_pytest(many, workers, work, pids,
                                       extra=(f"--fleet-concurrency={baseline_concurrency}",)))
            line += f", with --fleet-concurrency={baseline_concurrency} {baseline[-1]['wall_s']:.2f}s"
        if one_host:
            line += (f", one host {single[-1]['wall_s']:.2f}s "
                     f"(x{fleet[-1]['wall_s'] / single[-1]['wall_s']:.2f})")
        print(f"{line} (load {load()})", flush=True)
    result: dict[str, Any] = {"workers": workers, "fleet": median_run(fleet)}
    if baseline:
        result[f"fleet_concurrency_{baseline_concurrency}"] = median_run(baseline)
    if not one_host:
        return result
    result["one_host"] = median_run(single)
    result["ratio"] = round(result["fleet"]["wall_s"] / result["one_host"]["wall_s"], 2)
    # Each repeat's fleet run over the one-host run just before it: the pair shares the machine's speed of the
    # moment (a shared VM's CPUs drift by a third over minutes), which the ratio of two medians does not.
    paired = sorted(f["wall_s"] / s["wall_s"] for f, s in zip(fleet, single, strict=True))
    result["paired_ratios"] = [round(r, 2) for r in paired]
    result["paired_ratio_median"] = round(statistics.median(paired), 2)
    result["per_host_s"] = round((result["fleet"]["wall_s"] - result["one_host"]["wall_s"])
                                 / max(1, hosts - 1), 3)
    rss_one = result["one_host"]["controller_rss_mib"] or 0.0
    rss_fleet = result["fleet"]["controller_rss_mib"] or 0.0
    result["controller_mib_per_host"] = round((rss_fleet - rss_one) / max(1, hosts - 1), 3)
    if workers:
        worker_one = result["one_host"]["worker_rss_mib"] or 0.0
        worker_fleet = result["fleet"]["worker_rss_mib"] or 0.0
        result["worker_mib_per_host"] = round((worker_fleet - worker_one) / max(1, hosts / workers - 1), 3)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--workers", default="2,8",
                        help="-n values to compare, comma-separated (2 = -n auto here)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--merge", type=int, default=5000, help="synthetic verdicts to merge (0: skip)")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile the controller and the workers (-n 2)")
    parser.add_argument("--what-if-poll", type=float, default=0.0, metavar="S",
                        help="also run the fleet with the readiness watcher polling every S seconds "
                             "(what-if)")
    parser.add_argument("--baseline-concurrency", type=int, default=0, metavar="N",
                        help="also run the fleet with --fleet-concurrency=N each repeat "
                             "(1: hosts one by one)")
    parser.add_argument("--no-one-host", action="store_true", help="skip the one-host runs")
    parser.add_argument("--no-serial", action="store_true", help="skip the fleet run without xdist (-n 0)")
    parser.add_argument("--memo", action="store_true",
                        help="put benchmarks/memo_proxy.py in front of each server: a repeat of a "
                             "reproducible generation is answered from memory (the servers stop being the "
                             "bottleneck)")
    parser.add_argument("--host-python", metavar="PATH",
                        help="the profiles' host python (default: the profile default, python3 on PATH; here "
                             "a pyenv shim, a bash script that costs ~60 ms of CPU per start — a real host's "
                             "python is a binary, and starts on that host's CPU, not the runner's)")
    parser.add_argument("--runner-cpus", metavar="CPUS",
                        help="run pytest on these CPUs only (e.g. 0,1: a 2-core runner); with --host-cpus")
    parser.add_argument("--hosts-without-gpu", action="store_true",
                        help="no nvidia-smi on the host python's PATH: on a GPU box the 32 hosts would each "
                             "query the one GPU's driver, which a fleet of machines does not")
    parser.add_argument("--host-cpus", metavar="CPUS",
                        help="run the hosts' side here (e.g. 2-15): the shared servers, their memo proxies "
                             "and the probes' host python, as on a fleet whose hosts are other machines")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    global RUNNER_CPUS
    if bool(args.runner_cpus) != bool(args.host_cpus):
        parser.error("--runner-cpus and --host-cpus go together")
    host_cpus = parse_cpus(args.host_cpus) if args.host_cpus else None
    if host_cpus:
        RUNNER_CPUS = parse_cpus(args.runner_cpus)
        if RUNNER_CPUS & host_cpus:
            parser.error("--runner-cpus and --host-cpus overlap")
        os.sched_setaffinity(0, host_cpus)  # the servers and proxies started below inherit it
    worker_counts = [int(w) for w in args.workers.split(",")]

    sys.path.insert(0, str(ROOT))
    from pytest_dflash.refserver.launch import RefServerProcess

    results: dict[str, Any] = {"hosts": args.hosts, "cpus": os.cpu_count(), "load_before": load(), "runs": [],
                               "host_python": args.host_python or "python3 (profile default)",
                               "hosts_without_gpu": args.hosts_without_gpu,
                               "runner_cpus": sorted(RUNNER_CPUS) if RUNNER_CPUS else "all",
                               "host_cpus": sorted(host_cpus) if host_cpus else "all"}
    with tempfile.TemporaryDirectory(prefix="fleet-scale-") as tmp:
        work = Path(tmp)
        servers = {"none": RefServerProcess("--speculative-algorithm", "NONE", "--enable-metrics"),
                   "dflash": RefServerProcess("--speculative-algorithm", "DFLASH",
                                              "--speculative-num-draft-tokens", "8", "--enable-metrics")}
        proxies: list[subprocess.Popen[str]] = []
        try:
            for server in servers.values():
                server.start()
            for server in servers.values():
                server.wait_ready(120)
            urls = {name: server.url for name, server in servers.items()}
            pids = [server.pid for server in servers.values()]
            # a memoizing proxy per server: a repeated reproducible generation costs no model CPU
            if args.memo:
                for name in list(urls):
                    proxy, urls[name] = start_memo_proxy(urls[name])
                    proxies.append(proxy)
                    pids.append(proxy.pid)
                results["memo"] = "server_cpu_each_s: NONE, DFLASH, then their memo proxies"
            python = args.host_python
            if host_cpus or args.hosts_without_gpu:
                python = host_python(work, python or shutil.which("python3") or "python3", host_cpus,
                                     gpu=not args.hosts_without_gpu)
            one, many = work / "one", work / "fleet"
            one.mkdir()
            many.mkdir()
            for index in range(args.hosts):
                text = profile_text(f"host-{index:03d}", urls, python)
                (many / f"host-{index:03d}.toml").write_text(text)
                if index == 0:
                    (one / "host-000.toml").write_text(text)
            run_pytest(one, worker_counts[0], work, pids)  # warm-up: imports, page cache
            for workers in worker_counts:
                results["runs"].append(compare(one, many, workers, args.repeat, work, pids, args.hosts,
                                               f"-n {workers}",
                                               baseline_concurrency=args.baseline_concurrency,
                                               one_host=not args.no_one_host))
            if not args.no_serial:
                results["fleet_serial_n0"] = run_pytest(many, 0, work, pids)
            if args.what_if_poll:
                os.environ[POLL_ENV] = str(args.what_if_poll)
                try:
                    results["what_if_poll"] = {"poll_s": args.what_if_poll, "runs": [
                        compare(one, many, workers, args.repeat, work, pids, args.hosts,
                                f"-n {workers}, poll {args.what_if_poll:g}s") for workers in worker_counts]}
                finally:
                    del os.environ[POLL_ENV]
            if args.profile:
                profile_dir = work / "prof"
                profile_dir.mkdir()
                run_pytest(many, 2, work, pids, profile_dir=profile_dir)
                if os.environ.get("FLEET_SCALE_KEEP_PROFILE"):
                    shutil.copytree(profile_dir, os.environ["FLEET_SCALE_KEEP_PROFILE"], dirs_exist_ok=True)
                results["profile"] = {path.stem: {"self": top_functions(path, 10),
                                                  "waits": waiting_callers(path, 8)}
                                      for path in sorted(profile_dir.glob("*.prof"))}
            if args.merge:
                template = json.loads(sorted((work / "reports").glob("*.verdict.json"))[0].read_text())
                results["merge"] = merge_cost(template, args.merge, work)
            if args.memo:
                results["memo_stats"] = [
                    json.loads(urllib.request.urlopen(f"{url}/memo_stats", timeout=10).read())
                    for url in urls.values()]
        finally:
            for proxy in proxies:
                proxy.kill()
                proxy.wait()
            for server in servers.values():
                server.stop()
    results["load_after"] = load()
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
