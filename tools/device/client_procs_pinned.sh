#!/bin/bash
# Issue 15, item 3 on a 4-core client: benchmarks/client_procs.py on the device's 16-core box, the load CLI and
# its client processes pinned to CPUs 0-3 and 8 synthetic server processes (one port, SO_REUSEPORT) to CPUs
# 4-15, so the server is not what the clients wait on. Needs no GPU and nothing carried: the device's python has
# httpx and numpy, and the checkout is imported from PYTHONPATH. Results and logs go to $OUT (or /tmp/out).
#
#   run: bash tools/device/client_procs_pinned.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
{
  echo "cpus: $(nproc); load: $(cat /proc/loadavg)"
  lscpu | grep -E 'Model name|^CPU\(s\)|Thread' || true
  python3 -c 'import sys, httpx, numpy; print(sys.version.split()[0], "httpx", httpx.__version__, "numpy", numpy.__version__)'
} > "$OUT/machine-cp.txt" 2>&1
cat "$OUT/machine-cp.txt"
for concurrency in ${CONCURRENCY:-32 64}; do
  timeout 280 python3 benchmarks/client_procs.py --reps "${REPS:-3}" --procs 1,2,4 --concurrency "$concurrency" \
    --server-procs 8 --client-cpus 0-3 --server-cpus 4-15 --workdir "/tmp/cp-c$concurrency" \
    > "$OUT/client-procs-c$concurrency.log" 2>&1
  echo "concurrency $concurrency: rc $?"; sed -n '/^| --client-procs/,$p' "$OUT/client-procs-c$concurrency.log"
done
