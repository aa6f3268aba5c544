"""Re-read SGLang release wheels into releases.toml (what pytest-dflash reads, with provenance). Not run by tests.

    for v in 0.5.17 0.5.18 0.5.19 0.5.20 0.5.21 0.5.22 0.5.23; do
        pip download --no-deps sglang==$v -d /tmp/sgl/$v && (mkdir -p /tmp/sgl/src-$v && cd /tmp/sgl/src-$v && unzip -q ../$v/*.whl)
    done
    python tests/data/sglang-versions/read_wheels.py /tmp/sgl > tests/data/sglang-versions/releases.toml

Static reads only (nothing is imported): CLI flags are the `A[...]` fields of ServerArgs (minus `no_cli=True` and
fields with neither a help string nor an Arg(...), which argparse never sees) (or their `cli_name=`) plus their `aliases=` and every `parser.add_argument("--x")`;
a flag registered with a Deprecated*Action is `deprecated` and its `new_flag=` is the replacement SGLang names.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
import zipfile
from pathlib import Path

# (id, exact text searched on one source line, what in pytest-dflash reads it)
STRINGS = [
    ("fired-up", 'logger.info("The server is fired up and ready to roll!")', "readiness log / refserver start-up"),
    ("scheduler-exception", 'f"Scheduler hit an exception: {traceback}"', "catalog scheduler-crash"),
    ("sigquit-child", "Received sigquit from a child process. It usually means the child failed.",
     "catalog scheduler-crash"),
    ("subprocess-crashed", 'f"Subprocess {name} (pid={proc.pid}) crashed "', "catalog sglang-subprocess-died"),
    ("kill-process-tree", 'f"kill_process_tree called: parent_pid={parent_pid}, "', "catalog killed-sigkill-oom unless"),
    ("greedy-fallback", "falling back to greedy argmax verification.", "catalog greedy-fallback, generation layer"),
    ("max-running-reset", "Max running requests is reset to 48 for speculative decoding.",
     "catalog benign lines (item 2: a served override)"),
    ("deprecated-flag", "is deprecated and will be removed in a future", "catalog benign (--disable-cuda-graph)"),
    ("decode-accept-len", 'msg += f"accept len: {spec_accept_length:.2f}, accept rate: {spec_accept_rate:.2f}, "',
     "perf / acceptance (server log accept length)"),
    ("health-check-failed", "Health check failed. Server couldn't get a response from detokenizer for last",
     "readiness (/health_generate 503)"),
    ("block-size-conflict", "Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set ",
     "catalog bad-server-arguments"),
    ("dflash-needs-draft", "DFLASH speculative decoding requires setting --speculative-draft-model-path.",
     "catalog bad-server-arguments"),
    ("dflash-mask-oob", "DFLASH mask_token_id is outside the target vocab size. ", "catalog dflash-draft-mismatch"),
    ("dflash-layer-oob", "DFLASH target_layer_ids contains an out-of-range layer id. ", "catalog dflash-draft-mismatch"),
    ("dflash-fc-mismatch", "DFLASH fc.weight shape mismatch. This usually means the draft checkpoint's ",
     "catalog dflash-draft-mismatch"),
    ("dflash-runner-init", "Initialized DFLASH draft runner. attention_backend=%s, model=%s, block_size=%s, "
     "draft_window_size=%s, compact_cache=%s", "item 2: the served draft configuration"),
    ("dflash2-topk-fallback", "flashinfer is unavailable; the DFlash2 selector falls back to ",
     "catalog dflash2-selector-topk-fallback (new)"),
    ("dflash2-dense-head", "DFlash2 selector requires a dense FP16/BF16/FP32 target lm_head ",
     "catalog dflash2-needs-dense-lm-head (new)"),
    ("dflash-candidate-dense-head", "DFlash candidate top-k requires a dense FP16/BF16/FP32 target lm_head ",
     "catalog dflash2-needs-dense-lm-head (new; 0.5.23 wording)"),
    ("spec-v2-env-removed", "SGLANG_ENABLE_SPEC_V2 has been removed: speculative decoding ", "none (a warning)"),
    ("get-server-info-deprecated", "Endpoint '/get_server_info' is deprecated", "catalog benign lines"),
    ("get-load-deprecated", "Endpoint '/get_load' is deprecated", "catalog benign lines"),
    ("meta-spec-accept-length", 'meta_info["spec_accept_length"] = (', "client/sampling.py meta_info"),
    ("meta-spec-verify-ct", 'meta_info["spec_verify_ct"] = recv_obj.spec_verify_ct[i]', "client/sampling.py meta_info"),
    ("meta-spec-accepted-drafts-alias", 'meta_info["spec_accepted_drafts"] = num_correct_drafts',
     "refserver imitates it (alias of spec_num_correct_drafts)"),
    ("meta-spec-accept-histogram-alias", 'meta_info["spec_accept_histogram"] = (',
     "refserver imitates it (alias of spec_correct_drafts_histogram)"),
    ("server-info-launch-command", 'result["launch_command"] = server_args.launch_command', "item 2 (new)"),
    ("server-info-frontend", '"frontend": "python",', "none"),
    ("internal-state-accept-length", "avg_spec_accept_length", "load/serverinfo.py, perf: /server_info internal_states"),
    ("ready-route", '@app.get("/ready")', "readiness (new route)"),
    ("get-load-route", '@app.get("/get_load")', "none"),
    ("health-bypass-env", "envs.SGLANG_DIAG_BYPASS_HEALTH_GENERATE.get()", "readiness: /health_generate 200 "
     "without a generation when set"),
    ("metric-spec-verify-calls", 'name="sglang:spec_verify_calls_total"', "perf /metrics"),
    ("metric-num-requests", 'name="sglang:num_requests_total"', "perf /metrics"),
    ("metric-spec-accept-length", 'name="sglang:spec_accept_length"', "perf /metrics"),
]
PINS = ("torch", "sglang-kernel", "flashinfer-python", "transformers", "xgrammar")


def cli_flags(root: Path) -> dict[str, dict[str, str]]:
    srt = root / "sglang" / "srt"
    files = [srt / "server_args.py", *sorted((srt / "arg_groups").rglob("*.py"))]
    flags: dict[str, dict[str, str]] = {}
    for path in files:
        lines = path.read_text(encoding="utf-8").splitlines()
        where = str(path.relative_to(root))
        i = 0
        while i < len(lines):
            line = lines[i]
            field = re.match(r"^    ([a-z][a-z0-9_]*): A\[", line)
            opener, closer = ("[", "]") if field else ("(", ")")
            if not field and "add_argument(" not in line:
                i += 1
                continue
            j, depth = i, line.count(opener) - line.count(closer)
            while depth > 0 and j + 1 < len(lines):
                j += 1
                depth += lines[j].count(opener) - lines[j].count(closer)
            text = "\n".join(lines[i:j + 1])
            if field:
                bare = re.sub(r'NS\("[^"]*"\)', "", text)  # A[T, "help"] or A[T, Arg(...)]; else no flag
                if "no_cli=True" not in text and ('"' in bare or "Arg(" in bare):
                    named = re.search(r'cli_name="(--[a-z0-9-]+)"', text)
                    name = named.group(1) if named else "--" + field.group(1).replace("_", "-")
                    flags.setdefault(name, {"where": f"{where}:{i + 1}"})
                for group in re.findall(r"aliases=\[([^\]]*)\]", text):
                    for alias in re.findall(r'"(--[a-z0-9-]+)"', group):
                        flags.setdefault(alias, {"where": f"{where}:{i + 1}"})
            else:
                names = re.findall(r'^\s*"(--[a-z0-9][a-z0-9-]*)",?\s*$', text, re.M)
                names += re.findall(r'add_argument\(\s*"(--[a-z0-9-]+)"', text)
                new = re.search(r'new_flag="([^"]+)"', text)
                for name in dict.fromkeys(names):
                    entry = {"where": f"{where}:{i + 1}"}
                    if "Deprecated" in text:
                        entry["deprecated"] = "yes"
                        if new:
                            entry["new_flag"] = new.group(1)
                    flags[name] = entry
            i = j + 1
    return flags


def find(root: Path, needle: str) -> list[str]:
    hits = []
    for path in sorted((root / "sglang" / "srt").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if needle in line:
                hits.append(f"{path.relative_to(root)}:{number}")
    return hits


def q(value: str) -> str:
    return json.dumps(value)


def main() -> None:
    base = Path(sys.argv[1])
    versions = sorted((p.name[4:] for p in base.glob("src-*")), key=lambda v: tuple(int(x) for x in v.split(".")))
    out = ["# Generated by read_wheels.py from the sglang wheels on PyPI (static reads; nothing was run).", ""]
    flags = {v: cli_flags(base / f"src-{v}") for v in versions}
    for v in versions:
        meta = (base / f"src-{v}" / f"sglang-{v}.dist-info" / "METADATA").read_text(encoding="utf-8")
        out += ["[[release]]", f"version = {q(v)}"]
        for pin in PINS:
            m = re.search(rf"^Requires-Dist: {pin.replace('-', '[-_]')}(\[[^\]]*\])?==(\S+)", meta, re.M | re.I)
            out.append(f"{pin.replace('-', '_')} = {q(m.group(2)) if m else q('')}")
        out += [f"cli_flags = {len(flags[v])}", ""]
    for old, new in itertools.pairwise(versions):
        for flag in sorted(set(flags[old]) - set(flags[new])):
            entry = flags[old][flag]
            out += ["[[removed_flag]]", f"flag = {q(flag)}", f"last_in = {q(old)}", f"removed_in = {q(new)}",
                    f"replacement = {q(entry.get('new_flag', ''))}",
                    f"deprecated_in_last = {'true' if entry.get('deprecated') else 'false'}",
                    f"source = {q(old + ' ' + entry['where'])}", ""]
    first = versions[0]
    for flag, entry in sorted(flags[first].items()):
        if entry.get("deprecated"):
            out += ["[[deprecated_flag]]", f"flag = {q(flag)}", f"replacement = {q(entry.get('new_flag', ''))}",
                    f"source = {q(first + ' ' + entry['where'])}", ""]
    full = [v for v in versions if (base / f"src-{v}" / "sglang" / "srt" / "speculative").is_dir()]
    for wheel in sorted(base.glob("k-*/sglang_kernel-*.whl")):  # pip download --no-deps sglang-kernel==X -d k-X
        with zipfile.ZipFile(wheel) as archive:
            name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            meta = archive.read(name).decode()
        version = re.search(r"^Version: (\S+)", meta, re.M).group(1)  # type: ignore[union-attr]
        torch = re.search(r"^Requires-Dist: torch(\S*)", meta, re.M)
        out += ["[[sglang_kernel]]", f"version = {q(version)}", f"requires_torch = {q(torch.group(1) if torch else '')}",
                f"source = {q(wheel.name + ' ' + name)}", ""]
    for ident, needle, reader in STRINGS:
        out += ["[[string]]", f"id = {q(ident)}", f"text = {q(needle)}", f"reader = {q(reader)}"]
        for v in full:
            out.append(f"{q(v)} = {json.dumps(find(base / f'src-{v}', needle)[:3])}")
        out.append("")
    print("\n".join(out))


if __name__ == "__main__":
    main()
