#!/usr/bin/env bash
# ON THE GPU MACHINE, from the repo root: real SGLang 0.5.17 + the ddtree-v2 overlay (DDTREE), next to DFLASH and
# plain, provisioned by pytest-dflash from tools/device/h200-ddtree*.toml; the suites run from a frozen copy of
# the plugin in .device/snap (git archive HEAD). Outputs (few files: the device returns at most 8) go to $OUT.
# See docs/real-sglang.md ("DDTREE") and tests/data/sglang-0.5.17-h200-ddtree/README.md.
#
#   BUDGET=560 bash tools/device/run_real_ddtree.sh call1   # the high-acceptance pair: plain, DFLASH, DDTREE budget 32
#                                                           # and 8, started together: smoke acceptance perf parity,
#                                                           # --ddtree-accept-ratio 1.4; starts nothing detached
#   BUDGET=560 bash tools/device/run_real_ddtree.sh call2   # two pytest runs side by side: the lossy-verify fault
#                                                           # (smoke + parity) and the production configurations
#                                                           # (graphs, overlap, both; DFLASH both): smoke acceptance
#                                                           # parity perf; starts `fi-warm` detached first
#   BUDGET=560 bash tools/device/run_real_ddtree.sh call3   # flashinfer target backend (DDTREE, DFLASH), budget 64
#   BUDGET=400 bash tools/device/run_real_ddtree.sh lossy   # the lossy fault alone (run 3's call4)
#   BUDGET=560 bash tools/device/run_real_ddtree.sh configs-parity   # what run 3 left: smoke + parity on the
#                                                           # graphs / overlap / prod variants, nothing beside them
#   BUDGET=560 bash tools/device/run_real_ddtree.sh fi-parity        # ... and DDTREE on the flashinfer backend
#                                                           # (h200-ddtree-fi.toml): smoke acceptance parity perf
# DFLASH_DIAG_STACKS=EVERY:FOR (seconds) turns on tools/device/stack_sampler.py in every staged tree: each server
# process dumps its threads' stacks to /tmp/stacks every EVERY s for its first FOR s; they return as *-stacks.tar.xz.
# Diagnosis only: in run 4 the dumps crashed three servers (SIGSEGV).
# Ordered by what matters most, each call on the machine the previous one left warm (chain them: it stays warm
# ~30 s; a cold one re-pays ~2-5 min of Triton/FlashInfer JIT). fi-warm is a flashinfer-backend DDTREE server whose
# FlashInfer attention JIT builds (MAX_JOBS=6 of the 16 cores) run during call2 and between the calls; call3 stops
# it (by its process group) before its own servers start.
#
# One FlashInfer JIT build for every tree: the overlay makes /tmp/site_ddtree (and the lossy tree) a hard-link copy
# of /tmp/site, and FlashInfer keys its JIT builds on its resolved package path (flashinfer/jit/env.py) AND writes
# tvm_ffi's resolved include path into each module's build.ninja (jit/cpp_ext.py), so the trees' flashinfer/ and
# tvm_ffi/ are symlinks to /tmp/site's. Before run 4 only flashinfer/ was: processes of the two trees then rebuilt
# each other's norm and sampling modules, one after another under the module's file lock, which is where first
# requests spent minutes in runs 1-3 (tests/data/sglang-0.5.17-h200-ddtree/README.md, run4-stack-sampler-crash).
# setup() pre-builds both modules in the background while the first servers boot.
#
# Needs, carried along (git-ignored): .sglang-stage/ (site.tar.xz + make_models.py, from
# ../shared/reference/real-sglang/setup_and_run.sh; run 4 repacked it without jedi/, IPython's optional completer,
# 54 MB instead of 56), .device/real-ddtree/ (a copy of ../shared/reference/real-ddtree/), .device/wheels/
# (pytest-testinfra) and, optionally, .device/jit/*.tar.gz (JIT caches a previous call returned). Everything that
# travels must fit 64 MiB, this checkout included, so .device/snap/ (the plugin as committed) is made on the device:
#   run(command="mkdir -p .device/snap && cp -r pytest_dflash suites hosts pyproject.toml conftest.py .device/snap/ \
#       && BUDGET=555 bash tools/device/run_real_ddtree.sh PHASE",
#       carry=[".sglang-stage", ".device/real-ddtree", ".device/wheels", ".device/jit"])
# Every step is idempotent: a warm machine (the call right after another) skips what /tmp already holds.
set -u
PHASE=${1:-call1}
REPO=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
BUDGET=${BUDGET:-570}                    # seconds this call may use in all (the device kills at 600)
left() { echo $(( BUDGET - $(el) )); }
LOG="$OUT/$PHASE-timeline.log"
say() { echo "[$PHASE $(el)s] $*" | tee -a "$LOG"; }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

setup() {
  { echo "== date"; date -u; nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,memory.used --format=csv
    python3 -V; which python3; nproc; free -g | head -2; } > "$OUT/$PHASE-env.txt" 2>&1
  if [ -f /tmp/site/.unpacked ]; then say "warm: /tmp/site already unpacked"; else
    tar -C /tmp -xJf .sglang-stage/site.tar.xz && touch /tmp/site/.unpacked || { say "UNPACK FAILED"; exit 1; }
    say "unpacked /tmp/site"
  fi
  if [ ! -d "$HOME/.triton" ] && ls .device/jit/*.tar.gz >/dev/null 2>&1; then
    for t in .device/jit/*.tar.gz; do tar -C / -xzf "$t" && say "restored JIT cache $t"; done
  fi
  if [ ! -f /tmp/site_ddtree/.overlaid ]; then
    rm -rf /tmp/site_ddtree
    python3 .device/real-ddtree/apply_overlay.py --src /tmp/site --dst /tmp/site_ddtree > "$OUT/$PHASE-overlay.txt" 2>&1 \
      && touch /tmp/site_ddtree/.overlaid || { say "OVERLAY FAILED"; cat "$OUT/$PHASE-overlay.txt"; exit 1; }
    say "overlay applied: /tmp/site_ddtree"
  fi
  if [ ! -f /tmp/site_ddtree_lossy/.lossy ]; then
    rm -rf /tmp/site_ddtree_lossy
    python3 tools/device/make_lossy_tree.py --src /tmp/site_ddtree --dst /tmp/site_ddtree_lossy >> "$OUT/$PHASE-overlay.txt" 2>&1 \
      && touch /tmp/site_ddtree_lossy/.lossy && say "lossy tree: /tmp/site_ddtree_lossy" || say "LOSSY TREE FAILED"
  fi
  for t in /tmp/site_ddtree /tmp/site_ddtree_lossy; do   # one FlashInfer JIT build for every tree (see the top)
    for pkg in flashinfer tvm_ffi; do
      [ -d "$t" ] && [ ! -L "$t/$pkg" ] && rm -rf "$t/$pkg" && ln -s "/tmp/site/$pkg" "$t/$pkg" && say "$t/$pkg -> /tmp/site/$pkg"
    done
  done
  if [ -n "${DFLASH_DIAG_STACKS:-}" ]; then   # where first requests spend minutes: tools/device/stack_sampler.py
    for t in /tmp/site /tmp/site_ddtree /tmp/site_ddtree_lossy; do
      [ -d "$t" ] && rm -f "$t/sitecustomize.py" && cp tools/device/stack_sampler.py "$t/sitecustomize.py"
    done
    export DFLASH_DIAG_STACKS; say "stack sampler on ($DFLASH_DIAG_STACKS) in every tree"
  fi
  [ -f /tmp/models/draft/model.safetensors ] || { PYTHONPATH=/tmp/site python3 .sglang-stage/make_models.py /tmp/models \
      > "$OUT/$PHASE-models.txt" 2>&1 && say "random models: /tmp/models" || say "MODELS FAILED"; }
  [ -f /tmp/models_accept/draft/model.safetensors ] || { PYTHONPATH=/tmp/site python3 tools/device/make_accept_models.py \
      /tmp/models_accept --check --ddtree-src /tmp/site_ddtree >> "$OUT/$PHASE-models.txt" 2>&1 \
      && say "high-acceptance models: /tmp/models_accept" || say "ACCEPT MODELS FAILED"; }
  # The two FlashInfer JIT modules every server's first requests need (norm: the first forward; sampling: the first
  # sampled request), built once in the background while the first servers boot; a no-op when cached.
  if [ ! -f /tmp/res-prewarm.txt ]; then
    (PYTHONPATH=/tmp/site timeout 400 python3 -c 'import time; t=time.time()
from flashinfer.norm import get_norm_module; get_norm_module(); print("norm JIT ready in %.1fs" % (time.time()-t))
from flashinfer.sampling import get_sampling_module; get_sampling_module(); print("sampling JIT ready in %.1fs" % (time.time()-t))' \
       > /tmp/res-prewarm.txt 2>&1 &)
  fi
  if [ ! -d /tmp/plugin-site/testinfra ]; then
    mkdir -p /tmp/plugin-site && for w in .device/wheels/*.whl; do python3 -m zipfile -e "$w" /tmp/plugin-site; done
  fi
  (cd .device/snap && PYTHONPATH=/tmp/plugin-site:$PWD python3 -c 'import pytest, testinfra, httpx, pytest_dflash; print("pytest", pytest.__version__, "plugin", pytest_dflash.__file__)') >> "$LOG" 2>&1
  say "setup done"
}

# run_suite NAME PROFILE SECONDS "SUITES" [pytest args...]: one pytest run of the frozen plugin; outputs -> $OUT
run_suite() {
  local name=$1 profile=$2 secs=$3 suites=$4; shift 4
  local lim=$(( $(left) - 30 )); [ "$secs" -lt "$lim" ] || secs=$lim
  if [ "$secs" -lt 60 ]; then say "$name: SKIPPED, only ${secs}s left"; return 0; fi
  local res=/tmp/res/$name; rm -rf "$res" /tmp/stacks; mkdir -p "$res"
  say "$name: pytest --host $profile $suites (limit ${secs}s) $*"
  (cd .device/snap && DFLASH_STATE_DIR=/tmp/dflash-state-$name PYTHONPATH=/tmp/plugin-site:$PWD \
     timeout -k 15 -s TERM "$secs" python3 -m pytest -p pytest_dflash.plugin -p no:cacheprovider \
       --host "$REPO/$profile" $suites --dflash-report "$res" --junitxml "$res/junit.xml" -rA --durations=30 "$@" ${PYTEST_EXTRA:-} \
       > "$res/pytest.log" 2>&1)
  local rc=$?
  say "$name: pytest rc=$rc"
  stop_leftovers "/tmp/dflash-state-$name"
  grep -E "^(=+ .*(passed|failed|error).* =+|h200: )" "$res/pytest.log" | tail -3 | tee -a "$LOG"
  cp "$REPO/$profile" "$res/" 2>/dev/null
  # Decode lines carry the servers' own accept length ("accept len: X"); keep a digest per service log
  for f in /tmp/dflash-state-$name/logs/*; do
    [ -f "$f" ] || continue
    { echo "== $(basename "$f")"; grep -E "Initialized DDTREE|DDTREE v2 verify completed|Capture cuda graph|cuda graph: True|Traceback|Error|error:|accept len" "$f" | grep -v health | tail -25; } >> "$res/server-digest.txt"
  done
  tar -czf "$OUT/$name.tar.gz" -C /tmp/res "$name" -C /tmp "dflash-state-$name/logs" 2>/dev/null
  cp "$res/pytest.log" "$OUT/$name-pytest.log"
  [ -d /tmp/stacks ] && tar -cJf "$OUT/$name-stacks.tar.xz" -C /tmp stacks 2>/dev/null
  return 0
}

# Servers a cut-off pytest left running (its markers name each one's process group): stopped by their ids.
stop_leftovers() {
  python3 - "$1" <<'PY' 2>&1 | tee -a "$LOG"
import json, os, signal, sys, time, glob
for m in glob.glob(os.path.join(sys.argv[1], "markers", "*.json")):
    try:
        info = json.load(open(m))
        pgid = int(info.get("pgid") or info["pid"])
        os.kill(pgid, 0)
    except (OSError, ValueError, KeyError):
        continue
    print(f"leftover {info.get('service')} pgid {pgid}: SIGTERM")
    os.killpg(pgid, signal.SIGTERM)
    for _ in range(15):
        time.sleep(1)
        try:
            os.kill(pgid, 0)
        except OSError:
            break
    else:
        os.killpg(pgid, signal.SIGKILL)
PY
}

# A standalone server (not through the plugin), probed by probe_server.py; $1 label, $2 PYTHONPATH, $3 port, $4 wait, rest: args
standalone() {
  local label=$1 pp=$2 port=$3 wait=$4; shift 4
  mkdir -p /tmp/res/standalone
  PYTHONPATH=$pp timeout -k 10 $(( wait + 60 )) python3 -m sglang.launch_server --host 127.0.0.1 --port "$port" "$@" \
      > /tmp/res/standalone/server_$label.log 2>&1 < /dev/null &
  local pid=$!
  echo $pid > /tmp/res/standalone/$label.pid   # `timeout` leads its own process group: stop it by this id
  say "standalone $label pid $pid: $*"
  python3 tools/device/probe_server.py --base "http://127.0.0.1:$port" --pid $pid --wait "$wait" \
      --out /tmp/res/standalone/probe_$label.json --label "$label $*" >> /tmp/res/standalone/probe_summary.txt 2>&1
  say "standalone $label probe rc=$? ($(tail -1 /tmp/res/standalone/probe_summary.txt | cut -c1-300))"
  kill -TERM $pid 2>/dev/null; for i in $(seq 1 20); do kill -0 $pid 2>/dev/null || break; sleep 1; done
  kill -KILL $pid 2>/dev/null; wait $pid 2>/dev/null
  say "standalone $label stopped"
}

pack_jit() {
  { echo "== ~/.cache"; du -sh $HOME/.cache/* 2>/dev/null; echo "== ~/.triton"; du -sh $HOME/.triton 2>/dev/null;
    find $HOME/.cache/flashinfer -maxdepth 6 -name '*.so' 2>/dev/null | head -50; } > "$OUT/$PHASE-jit-listing.txt"
  # Run 1: flashinfer 33 MB, tvm-ffi 12 MB, triton 8.7 MB (13.7 + 1.3 MB gzipped, without tvm-ffi): flashinfer's
  # is too big to carry next to site.tar.xz (~54 MiB of the 64 MiB); Triton's (~1.3 MB) comes back, for .device/jit/.
  [ -d "$HOME/.triton" ] && tar -czf "$OUT/jit-triton.tar.gz" -C / "${HOME#/}/.triton" 2>/dev/null
  :
}

case $PHASE in
  call1)
    setup
    run_suite c1-accept tools/device/h200-ddtree-accept.toml $(( BUDGET - 40 )) \
        "suites/smoke suites/parity/test_acceptance.py suites/perf suites/parity/test_parity.py" \
        -k "not serving_chains_import and not torch_has_kernels" -o timeout=300 --ddtree-accept-ratio 1.4
    cat /tmp/res-prewarm.txt >> "$LOG" 2>/dev/null
    pack_jit
    ;;
  call2)
    setup
    # FlashInfer's attention JIT for call3's flashinfer-backend services: detached, so it outlives this call.
    if [ ! -f /tmp/fi-warm.pid ]; then
      setsid nohup env OUT=/tmp/fi-warm-out MAX_JOBS=6 bash tools/device/run_real_ddtree.sh fi-warm > /tmp/fi-warm.log 2>&1 < /dev/null &
      echo $! > /tmp/fi-warm.pid; say "fi-warm started detached (pid $(cat /tmp/fi-warm.pid))"
    fi
    # The lossy fault (correctness only) beside the production configurations; the perf numbers of the latter are
    # measured while the lossy run's parity requests and fi-warm's compiles share the machine (stated in the README).
    run_suite c2-lossy tools/device/h200-ddtree-lossy.toml 300 "suites/smoke suites/parity/test_parity.py" \
        -k "not serving_chains_import and not torch_has_kernels" -o timeout=250 &
    local_lossy=$!
    run_suite c2-configs tools/device/h200-ddtree-configs.toml $(( BUDGET - 40 )) \
        "suites/smoke suites/parity/test_acceptance.py suites/parity/test_parity.py suites/perf" \
        -k "not serving_chains_import and not torch_has_kernels" -o timeout=300 --ddtree-accept-ratio 1.4
    wait $local_lossy
    ;;
  fi-warm)   # started by call2; a flashinfer-backend DDTREE server on the pair, probed (greedy, sampled, return_logprob)
    standalone ddtree_flashinfer /tmp/site_ddtree 31999 480 --model-path /tmp/models_accept/target \
        --attention-backend flashinfer --mem-fraction-static 0.85 --max-total-tokens 131072 --disable-cuda-graph \
        --disable-overlap-schedule --enable-metrics --speculative-algorithm DDTREE \
        --speculative-draft-model-path /tmp/models_accept/draft --speculative-ddtree-budget 32
    exit 0
    ;;
  call3)
    setup
    if [ -f /tmp/fi-warm.pid ]; then   # stop the warm-up server by its process group id (setsid made it a leader)
      say "fi-warm (pid $(cat /tmp/fi-warm.pid)) still running: $(kill -0 "$(cat /tmp/fi-warm.pid)" 2>/dev/null && echo yes || echo no)"
      for pg in $(cat /tmp/fi-warm.pid /tmp/res/standalone/ddtree_flashinfer.pid 2>/dev/null); do
        kill -TERM -- -"$pg" 2>/dev/null
        for i in $(seq 1 15); do kill -0 -- -"$pg" 2>/dev/null || break; sleep 1; done; kill -KILL -- -"$pg" 2>/dev/null
      done
      say "fi-warm stopped; $(ls $HOME/.cache/flashinfer/*/90a/cached_ops 2>/dev/null | tr '\n' ' ')"
      mkdir -p /tmp/res/standalone; cp /tmp/fi-warm.log /tmp/fi-warm-out/*.log /tmp/res/standalone/ 2>/dev/null
      tar -czf "$OUT/c3-fi-warm.tar.gz" -C /tmp/res standalone 2>/dev/null
    fi
    run_suite c3-configs2 tools/device/h200-ddtree-configs2.toml $(( BUDGET - 40 )) \
        "suites/smoke suites/parity/test_acceptance.py suites/parity/test_parity.py suites/perf" \
        -k "not serving_chains_import and not torch_has_kernels" -o timeout=300 --ddtree-accept-ratio 1.4
    ;;
  lossy)     # the lossy fault alone (call2's side-by-side run lost its plain reference's readiness to the contention)
    setup
    run_suite c4-lossy tools/device/h200-ddtree-lossy.toml $(( BUDGET - 30 )) "suites/smoke suites/parity/test_parity.py" \
        -k "not serving_chains_import and not torch_has_kernels" -o timeout=$(( BUDGET - 60 ))
    ;;
  configs-parity|fi-parity)   # one profile alone, a test timeout as long as the call: run 3 lost these to 300 s
    setup
    prof=tools/device/h200-ddtree-configs.toml; suites="suites/smoke suites/parity/test_parity.py"
    [ "$PHASE" = fi-parity ] && prof=tools/device/h200-ddtree-fi.toml \
      && suites="suites/smoke suites/parity/test_acceptance.py suites/parity/test_parity.py suites/perf"
    run_suite "c5-$PHASE" "$prof" $(( BUDGET - 30 )) "$suites" \
        -k "not serving_chains_import and not torch_has_kernels" -o timeout=$(( BUDGET - 60 ))
    cat /tmp/res-prewarm.txt >> "$LOG" 2>/dev/null
    ;;
  setup) setup ;;   # for a dry run of the staging steps
  *) echo "unknown phase $PHASE"; exit 2 ;;
esac
# The device returns at most 8 files from $OUT: fold the small text files into one archive.
(cd "$OUT" && ls $PHASE-env.txt $PHASE-models.txt $PHASE-overlay.txt $PHASE-jit-listing.txt 2>/dev/null \
   | xargs -r tar -czf "$PHASE-meta.tar.gz" && rm -f $PHASE-env.txt $PHASE-models.txt $PHASE-overlay.txt $PHASE-jit-listing.txt)
say "done; files:"; ls -la "$OUT" | tee -a "$LOG"
