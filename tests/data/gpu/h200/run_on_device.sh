#!/usr/bin/env bash
# How tests/data/gpu/h200/ was recorded: run ON the H200 device machine from the repo root, with .whl/
# (pytest-testinfra for the controller) and .gpu-stage/site.tar.xz (the SGLang 0.5.17 stack, staged
# as in ../../../../docs/gpu-layers.md) carried along. Writes everything under $OUT.
#   1. the host, env and kernels layers against profile.toml (cold JIT caches), raw probe outputs dumped;
#   2. seed 004 on purpose: a service whose toolchain is broken (NVCC_APPEND_FLAGS) behind a warm
#      sampling cache built in the background during step 1 (profile-broken-nvcc.toml).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo "[device] $(( $(date +%s) - T0 ))s $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/ctl .whl/*.whl || exit 1
tar -C /tmp -xJf .gpu-stage/site.tar.xz || exit 1
el "unpacked"
export PYTHONUNBUFFERED=1
( mkdir -p /tmp/svc-warm; cd /tmp && PYTHONPATH=/tmp/site CUDA_HOME=/usr/local/cuda FLASHINFER_WORKSPACE_BASE=/tmp/svc-warm \
  timeout 300 python3 -c 'import time, torch, flashinfer.sampling as s
t = time.monotonic(); p = torch.softmax(torch.randn(4, 128, device="cuda"), -1)
print("warm sampling:", s.top_k_top_p_sampling_from_probs(p, 5, 0.9).tolist(), round(time.monotonic() - t, 1), "s")'
) > "$OUT/warm-cache.log" 2>&1 &
WARM=$!
run_pytest() {  # $1 limit, $2 label, rest: pytest args
  local limit=$1 label=$2; shift 2
  mkdir -p "$OUT/$label"
  PYTHONPATH="$PWD:/tmp/ctl" timeout "$limit" python3 -m pytest -p pytest_dflash.plugin -p no:cacheprovider -rA \
    --dflash-probe-dump "$OUT/$label" --dflash-report "$OUT/$label" --junitxml "$OUT/$label/junit.xml" "$@" 2>&1 \
    | tee "$OUT/$label/pytest.log" | grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed|dflash kernels|: (ok|FAILED)" 
  el "$label done"
}
run_pytest 430 layers --host tests/data/gpu/h200/profile.toml suites/host suites/env suites/kernels --kernels-timeout 240s \
  --save-env-snapshot "$OUT/layers/env-snapshot.json"
wait $WARM; el "warm cache: $(tail -1 "$OUT/warm-cache.log")"
run_pytest 120 broken --host tests/data/gpu/h200/profile-broken-nvcc.toml suites/kernels \
  -k "sampling_builds_cold or warm_jit_cache"
cp "$OUT/warm-cache.log" "$OUT/broken/"
tar -czf "$OUT/h200-raw.tar.gz" -C "$OUT" layers broken && rm -rf "$OUT/layers" "$OUT/broken" "$OUT/warm-cache.log"
ls -la "$OUT"; el "total"
