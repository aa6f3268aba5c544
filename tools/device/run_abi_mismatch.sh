#!/usr/bin/env bash
# ON THE GPU MACHINE, from the repo root (issue 25 item 6): SGLang 0.5.19 and its sglang-kernel 0.4.6.post1 (built
# for torch 2.13) staged over the H200's own torch 2.11 (system python3); the env layer must name the mismatch
# (which package, built for which torch, which torch is installed) before any server starts. See
# docs/sglang-versions.md ("The ABI mismatch on the H200").
# Needs, carried along (git-ignored): .abi-stage/ (sglang-0.5.19-*.whl and kpart.tgz: sglang-kernel 0.4.6.post1's
# Python files, dist-info and sm90/common_ops.abi3.so) and .device/wheels/ (pytest-testinfra).
#   bash tools/device/run_abi_mismatch.sh                 # carry [".abi-stage", ".device"]
# PYTHON runs pytest, SERVICE_PYTHON (default PYTHON) is the profile's host.python: staging and raw evidence use it.
# The local dry run (no GPU) is tools/device/dry_run_abi_mismatch.sh.
# At most 6 files come back in $OUT: evidence.txt, pytest.log, junit.xml, <host>.verdict.json, report.tar.gz,
# probes.tar.gz.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
BUDGET=${BUDGET:-300}
PY=${PYTHON:-python3}
SPY=${SERVICE_PYTHON:-$PY}
STAGE=${ABI_STAGE:-.abi-stage}
SITE=${ABI_SITE:-/tmp/abi-site}      # the profile's service env says PYTHONPATH=/tmp/abi-site
PROFILE=${PROFILE:-tools/device/h200-abi.toml}
SUITES=${SUITES:-"suites/env suites/smoke"}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export DFLASH_STATE_DIR=${DFLASH_STATE_DIR:-/tmp/dflash-state-abi}
EV="$OUT/evidence.txt"

# ---- stage: the wheel is a zip (its cp311 tag only matters for sglang's 4 Rust extensions, loaded lazily by
# the rust server / gRPC paths, not by any import chain the env layer checks); kpart.tgz unpacks beside it
WHEEL=$(ls "$STAGE"/sglang-0.5.19-*.whl 2>/dev/null | head -1)
[ -n "$WHEEL" ] && [ -f "$STAGE/kpart.tgz" ] || { echo "[abi] missing $STAGE/sglang-0.5.19-*.whl or kpart.tgz"; exit 1; }
rm -rf "$SITE" && mkdir -p "$SITE" || exit 1
"$SPY" -m zipfile -e "$WHEEL" "$SITE" && tar -C "$SITE" -xzf "$STAGE/kpart.tgz" || exit 1
echo "[abi] staged $SITE at $(el)s"

# ---- raw evidence, outside the plugin: versions, then `import sgl_kernel` as the service would import it
{
    echo "## $(date -u +%FT%TZ) $(uname -nr)"
    echo "## $SPY: $("$SPY" --version 2>&1) at $(command -v "$SPY")"
    if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>&1 | head -2
    else echo "(no nvidia-smi)"; fi
    echo "## pip list (the interpreter's own site-packages, without $SITE)"
    timeout 60 "$SPY" -m pip list --disable-pip-version-check 2>&1 | grep -iE '^(torch|triton|sglang|sgl|flashinfer|nvidia-(cuda-runtime|cublas|nccl)|xgrammar|transformers) ' || echo "(pip list: nothing of the serving stack, or no pip)"
    echo "## versions seen with PYTHONPATH=$SITE (the service's environment)"
    PYTHONPATH="$SITE" timeout 60 "$SPY" - <<'EOF' 2>&1
import importlib.metadata as md
for name in ("torch", "sglang", "sglang-kernel", "triton", "flashinfer-python", "xgrammar", "transformers"):
    try:
        dist = md.distribution(name)
        print(f"{name} {dist.version} at {dist.locate_file('')}")
    except md.PackageNotFoundError:
        print(f"{name} not installed")
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "cxx11abi", torch._C._GLIBCXX_USE_CXX11_ABI)
except Exception as exc:
    print("import torch:", type(exc).__name__, exc)
EOF
    echo "## PYTHONPATH=$SITE $SPY -c 'import sgl_kernel'"
    PYTHONPATH="$SITE" timeout 120 "$SPY" -c "import sgl_kernel; print('sgl_kernel imported from', sgl_kernel.__file__)" 2>&1 | tail -40
    echo "## rc=${PIPESTATUS[0]}"
    echo "## C++ symbols of the sm90 build that the installed torch's libraries do not define (ldd -r, first 10)"
    so="$SITE/sgl_kernel/sm90/common_ops.abi3.so"
    tlib=$("$SPY" -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("torch").origin) + "/lib")' 2>/dev/null)
    LD_LIBRARY_PATH="$tlib" timeout 60 ldd -r "$so" 2>&1 | grep "undefined symbol: _Z" | head -10 | \
        { command -v c++filt >/dev/null && c++filt || cat; }
} > "$EV" 2>&1
echo "[abi] evidence at $(el)s"; cat "$EV"

# ---- the plugin, its testinfra wheel unpacked as run_real_sglang.sh does
mkdir -p /tmp/plugin-site && for w in .device/wheels/*.whl; do "$PY" -m zipfile -e "$w" /tmp/plugin-site; done
export PYTHONPATH=/tmp/plugin-site:$PWD
left=$(( BUDGET - $(el) - 30 )); [ "$left" -gt 30 ] || left=30
rm -rf "$OUT/report"
# the device has the plugin from the checkout only; where it is pip-installed (here) its entry point loads it
timeout -k 10 "$left" "$PY" -m pytest ${PLUGIN-"-p pytest_dflash.plugin"} -p no:cacheprovider --host "$PROFILE" $SUITES \
    --dflash-report "$OUT/report" --dflash-probe-dump "$OUT/probes" --junitxml "$OUT/junit.xml" -rA ${EXTRA:-} \
    > "$OUT/pytest.log" 2>&1
rc=$?
echo "[abi] pytest rc=$rc at $(el)s"
{
    echo "## pytest rc=$rc"
    echo "## $DFLASH_STATE_DIR after the run (a started server leaves its log under logs/)"
    find "$DFLASH_STATE_DIR" -maxdepth 3 2>/dev/null | sort | head -40
    echo "## sglang processes still running"
    pgrep -af "sglang.launch_server" || echo "none"
} >> "$EV"
cp "$OUT"/report/*.verdict.json "$OUT/" 2>/dev/null
tar -czf "$OUT/report.tar.gz" -C "$OUT" report 2>/dev/null && rm -rf "$OUT/report"
tar -czf "$OUT/probes.tar.gz" -C "$OUT" probes 2>/dev/null && rm -rf "$OUT/probes"
grep -E "sglang-kernel|undefined symbol|torch==|PASSED|FAILED|SKIPPED|ERROR|passed|failed" "$OUT/pytest.log" | tail -60
ls -la "$OUT"
