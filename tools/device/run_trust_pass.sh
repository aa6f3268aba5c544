#!/usr/bin/env bash
# ON THE GPU MACHINE, from the repo root (issue 39 on real SGLang 0.5.17). Two pytest runs of
# tools/device/run_real_sglang.sh, chained on one machine so the second finds FlashInfer's JIT cache warm:
#   1. suites/smoke --gate service,generation on tools/device/h200-structured.toml (plain, DFLASH, NGRAM and
#      `--grammar-backend none`): the deploy gate must fail on the grammar-off server (seed 002), naming it;
#   2. suites/generation's structured / tool-call / reasoning / chat checks on the same four servers.
# PHASE=smoke or PHASE=generation runs one of them (a call each, chained on the warm machine);
# PHASE=all instead runs every suite on tools/device/h200.toml (plain + DFLASH): no false failures.
# Everything comes back as one archive ($OUT/trust.tar.gz): the run tool returns at most 8 files.
# Carry: .sglang-stage .device/wheels (docs/real-sglang.md).
set -u
FINAL=${OUT:-/tmp/out}; mkdir -p "$FINAL"; work=/tmp/trust; mkdir -p "$work"
run() {  # NAME PROFILE SUITES BUDGET ADDOPTS (pytest shlex-splits PYTEST_ADDOPTS; EXTRA is split on blanks)
    OUT=$work/$1 PROFILE=$2 SUITES=$3 BUDGET=$4 PYTEST_ADDOPTS=$5 bash tools/device/run_real_sglang.sh > "$work/$1.txt" 2>&1
    echo "== $1: $(grep -E '^\[dev\] pytest rc' "$work/$1.txt")"; grep -E '(passed|failed|error).* in [0-9.]+s' "$work/$1.txt" | tail -1
    grep -E '^(gate |[a-z0-9-]+: (PASS|FAIL|PARTIAL|INTERRUPTED))' "$work/$1/pytest.log" | head -20
}
case ${PHASE:-structured} in
    structured) PHASES="smoke generation" ;;
    *) PHASES=$PHASE ;;
esac
for phase in $PHASES; do case $phase in
    smoke)
        run smoke tools/device/h200-structured.toml suites/smoke "${B1:-270}" "--gate service,generation" ;;
    generation)
        run generation tools/device/h200-structured.toml suites/generation "${B2:-280}" \
            "-k \"${GEN_K:-structured or forced_tool_call or reasoning or stop_string or sampling_varies}\"" ;;
    all)
        run all tools/device/h200.toml "suites/smoke suites/generation suites/parity suites/perf" "${B1:-540}" "" ;;
esac; done
rm -rf "$work"/*/server-logs.tar.gz.tmp
tar -czf "$FINAL/trust.tar.gz" -C /tmp trust
ls -la "$FINAL"
