#!/usr/bin/env bash
# ON A 2-GPU MACHINE (device kind nvidia-h200-x2), from the repo root: real SGLang 0.5.17 at --tp-size 2 through
# pytest-dflash. Carry .sglang-stage/ and .device/wheels/ as for run_real_sglang.sh. Outputs go to $OUT.
#   1. every suite, provisioned: plain TP2 + DFLASH TP2 on GPUs 0,1 (tools/device/h200x2-tp.toml)
#   2. attached to a TP2 DFLASH server started by hand: one rank SIGKILLed 8 s into smoke (a rank's death named
#      with its rank, pid and GPU), then a fresh server with one rank SIGSTOPped (a wedge at TP: [engine-stuck]
#      naming the tensor-parallel engine and the stopped rank)
# Each step's verdict JSON, pytest log and server log land in $OUT/<step>/.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -L > "$OUT/gpus.txt" 2>&1
[ "$(grep -c '^GPU ' "$OUT/gpus.txt")" -ge 2 ] || { echo "needs 2 GPUs:"; cat "$OUT/gpus.txt"; exit 1; }
SUITES="suites/smoke suites/host suites/env suites/service suites/generation suites/parity suites/perf" \
    PROFILE=tools/device/h200x2-tp.toml BUDGET=${BUDGET:-420} OUT="$OUT/provisioned" \
    bash tools/device/run_real_sglang.sh
export PYTHONPATH=/tmp/plugin-site:$PWD DFLASH_STATE_DIR=/tmp/dflash-state
serve() {  # a TP2 DFLASH server on GPUs 0,1, in a session of its own; prints its pid
    CUDA_VISIBLE_DEVICES=0,1 PYTHONPATH=/tmp/site setsid python3 -m sglang.launch_server \
        --model-path /tmp/models/target --host 127.0.0.1 --port "$1" --attention-backend triton \
        --mem-fraction-static 0.3 --disable-cuda-graph --enable-metrics --tp-size 2 \
        --speculative-algorithm DFLASH --speculative-draft-model-path /tmp/models/draft > "$2" 2>&1 &
    echo $!
}
rank_pid() { pgrep -f "^sglang::scheduler_TP$1" | head -1; }
attached() {  # step name, port, signal, rank
    local step=$1 port=$2 sig=$3 rank=$4 dir="$OUT/$1"; mkdir -p "$dir"
    local pid; pid=$(serve "$port" "$dir/server.log")
    timeout 300 bash -c "until curl -sf http://127.0.0.1:$port/health_generate >/dev/null; do sleep 2; done"
    ps -eo pid,ppid,stat,args | grep -E 'sglang::|launch_server' | grep -v grep > "$dir/processes.txt"
    timeout 240 python3 -m pytest -p pytest_dflash.plugin -p no:cacheprovider \
        --attach "http://127.0.0.1:$port" --attach-log-command "cat $dir/server.log" --request-timeout 30s \
        suites/smoke suites/generation --dflash-report "$dir" -rA > "$dir/pytest.log" 2>&1 &
    local run=$!
    sleep 8
    local victim; victim=$(rank_pid "$rank")
    echo "$(date +%s.%N) kill -$sig $victim (TP$rank)" > "$dir/signalled"
    kill "-$sig" "$victim"
    wait "$run"; echo "rc=$? at $(date +%s.%N)" >> "$dir/signalled"
    kill -CONT "$victim" 2>/dev/null; kill -9 -- "-$pid" 2>/dev/null; pkill -9 -f 'sglang::' ; sleep 3
    tail -25 "$dir/pytest.log"
}
attached rank-killed 30101 KILL 1
attached rank-stopped 30102 STOP 1
ls -laR "$OUT" | head -60
