#!/usr/bin/env bash
# ON THE GPU MACHINE, from the repo root (issue 42): a load sweep of real SGLang 0.5.17 on the high-acceptance pair
# (tools/device/make_accept_models.py: DFLASH accepts ~2 tokens per step, DDTREE budget 32 ~5, NGRAM drafts from the
# target's own "A B A B" repetition), four servers on one GPU: plain, NGRAM, DFLASH, DDTREE (the ddtree-v2 overlay).
# The same engine settings for all four (triton attention, no CUDA graphs: what the DDTREE overlay serves), so the
# curves differ by the speculation alone.
#
# Levels are swept interleaved: every service at concurrency L (the service order rotating per level) before L+1,
# each run `python -m pytest_dflash.load` through native /generate with warm-up = L requests and a fixed duration;
# one LoadResult JSON per service per level, the format the perf layer writes (reports/perf/<host>/<svc>.json).
# Everything comes back as one archive ($OUT/sweep.tar.gz); tests/data/sglang-0.5.17-h100-sweep/ holds it unpacked.
#
#   run(command="BUDGET=560 bash tools/device/run_real_sweep.sh",
#       carry=[".sglang-stage", ".device/real-ddtree", ".device/wheels"])
# LEVELS="1 4 16 64" DURATION=6 override the sweep; PROMPT_LEN / OUTPUT_LEN the request shape. REQS_X=20 measures
# REQS_X x the level requests per level (DURATION then only caps it): 20 resampling blocks, what a judgement on
# bounds needs. SERVICES="none dflash" starts only those. CLIENT_PROCS=4 spreads the load client over processes
# (a 6 s level at concurrency 32+ saturated one event loop: refused at the 5 ms lag limit).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
BUDGET=${BUDGET:-560}
left() { echo $(( BUDGET - $(el) )); }
res=/tmp/sweep; mkdir -p "$res/runs" "$res/logs"
LOG=$res/timeline.log
say() { echo "[sweep $(el)s] $*" | tee -a "$LOG"; }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
LEVELS=${LEVELS:-"1 2 4 8 16 32 64 128"}
DURATION=${DURATION:-6}
PROMPT_LEN=${PROMPT_LEN:-128}
OUTPUT_LEN=${OUTPUT_LEN:-128}

{ date -u; nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv; python3 -V; nproc;
  free -g | head -2; uptime; } > "$res/env.txt" 2>&1
[ -f /tmp/site/.unpacked ] || { tar -C /tmp -xJf .sglang-stage/site.tar.xz && touch /tmp/site/.unpacked; } \
    || { say "UNPACK FAILED"; exit 1; }
if [ ! -f /tmp/site_ddtree/.overlaid ]; then
    rm -rf /tmp/site_ddtree
    python3 .device/real-ddtree/apply_overlay.py --src /tmp/site --dst /tmp/site_ddtree > "$res/overlay.txt" 2>&1 \
        && touch /tmp/site_ddtree/.overlaid || { say "OVERLAY FAILED"; cat "$res/overlay.txt"; }
fi
for pkg in flashinfer tvm_ffi; do  # one FlashInfer JIT build for both trees (run_real_ddtree.sh says why)
    [ -d /tmp/site_ddtree ] && [ ! -L /tmp/site_ddtree/$pkg ] && rm -rf /tmp/site_ddtree/$pkg && ln -s /tmp/site/$pkg /tmp/site_ddtree/$pkg
done
[ -f /tmp/models_accept/draft/model.safetensors ] || PYTHONPATH=/tmp/site python3 tools/device/make_accept_models.py \
    /tmp/models_accept > "$res/models.txt" 2>&1 || { say "MODELS FAILED"; cat "$res/models.txt"; exit 1; }
say "setup done"

common=(--model-path /tmp/models_accept/target --host 127.0.0.1 --mem-fraction-static 0.85 --max-total-tokens 262144
        --enable-metrics --attention-backend triton --disable-cuda-graph)
declare -A PORT=([none]=31001 [ngram]=31002 [dflash]=31003 [ddtree]=31004)
declare -A SITE=([none]=/tmp/site [ngram]=/tmp/site [dflash]=/tmp/site [ddtree]=/tmp/site_ddtree)
declare -A SPEC=(
    [none]=""
    [ngram]="--speculative-algorithm NGRAM --speculative-num-draft-tokens 8"
    [dflash]="--speculative-algorithm DFLASH --speculative-draft-model-path /tmp/models_accept/draft"
    [ddtree]="--speculative-algorithm DDTREE --speculative-draft-model-path /tmp/models_accept/draft --disable-overlap-schedule --speculative-ddtree-budget 32")
read -r -a SERVICES <<< "${SERVICES:-none ngram dflash ddtree}"
for s in "${SERVICES[@]}"; do
    # shellcheck disable=SC2086
    setsid env PYTHONPATH=${SITE[$s]} python3 -m sglang.launch_server "${common[@]}" --port "${PORT[$s]}" ${SPEC[$s]} \
        > "$res/logs/$s.log" 2>&1 &
    echo $! > "$res/logs/$s.pid"
done
cleanup() { for s in "${SERVICES[@]}"; do kill -TERM -- -"$(cat "$res/logs/$s.pid")" 2>/dev/null; done; sleep 3;
            for s in "${SERVICES[@]}"; do kill -KILL -- -"$(cat "$res/logs/$s.pid")" 2>/dev/null; done; }
trap cleanup EXIT
up=()
for s in "${SERVICES[@]}"; do
    while [ "$(left)" -gt 60 ]; do
        kill -0 "$(cat "$res/logs/$s.pid")" 2>/dev/null || { say "$s DIED"; tail -20 "$res/logs/$s.log" | tee -a "$LOG"; break; }
        curl -sf -m 2 "http://127.0.0.1:${PORT[$s]}/v1/models" >/dev/null && {
            # one generate request: the first forward's JIT work does not land in a measured level
            curl -sf -m 120 "http://127.0.0.1:${PORT[$s]}/generate" -H 'content-type: application/json' \
                -d '{"text": "warm up", "sampling_params": {"max_new_tokens": 16, "temperature": 0}}' > /dev/null
            say "$s ready"; up+=("$s"); break; }
        sleep 2
    done
done
export PYTHONPATH=$PWD:/tmp/site
i=0
for level in $LEVELS; do
    n=${#up[@]}; [ "$n" -gt 0 ] || break
    for k in $(seq 0 $(( n - 1 ))); do
        s=${up[$(( (k + i) % n ))]}
        [ "$(left)" -gt $(( DURATION + 40 )) ] || { say "budget spent before $s at concurrency $level"; break 2; }
        acc=""; [ "$s" = none ] || acc=--server-accept-length
        size=(--duration "$DURATION"); [ -n "${REQS_X:-}" ] && size=(--num-requests $(( REQS_X * level )) --duration "$DURATION")
        timeout $(( DURATION + 90 )) python3 -m pytest_dflash.load "http://127.0.0.1:${PORT[$s]}" --endpoint generate \
            --concurrency "$level" "${size[@]}" --warmup "$level" --prompt-len "$PROMPT_LEN" \
            --client-procs "${CLIENT_PROCS:-1}" \
            --output-len "$OUTPUT_LEN" --request-timeout 60 $acc --out "$res/runs/$s-c$level.json" \
            > "$res/runs/$s-c$level.txt" 2>&1
        say "$s c=$level rc=$? $(grep -m1 -oE '[0-9.]+ output tok/s' "$res/runs/$s-c$level.txt") $(grep -m1 -oE 'accept length [0-9.]+' "$res/runs/$s-c$level.txt")"
    done
    i=$(( i + 1 ))
done
for s in "${SERVICES[@]}"; do grep -E "accept len|Traceback|Error" "$res/logs/$s.log" | tail -8 > "$res/logs/$s.digest"; done
cleanup; trap - EXIT
uptime >> "$res/env.txt"
tar -czf "$OUT/sweep.tar.gz" -C /tmp sweep
ls -la "$OUT"
