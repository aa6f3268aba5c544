#!/bin/bash
# Issue 15's fleet target on a 2-core runner whose hosts are other machines: benchmarks/fleet_scale.py on the
# device's 16-core box, pytest pinned to CPUs 0-1 and the hosts' side (shared refservers, memo proxies, the
# probes' host python) on CPUs 2-15. Needs no GPU. Results and logs go to $OUT (or /tmp/out).
#
#   run: bash tools/device/fleet_scale_pinned.sh      carry: [".device/fleet-wheels"]
#
# .device/fleet-wheels: wheels (for the device's Python 3.12) of the versions this checkout's venv runs; the
# device's python has httpx, torch, numpy and prometheus_client, not these (5.2 MB; fastapi 0.165 imports
# opentelemetry, the refserver imports soundfile as SGLang's HTTP server does):
#   .venv/bin/pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d .device/fleet-wheels pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pytest-xdist==3.8.0 execnet==2.1.2 \
#       pytest-testinfra==10.2.2 pytest-timeout==2.4.0 fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 \
#       pydantic_core==2.50.5 annotated-types==0.8.0 annotated-doc==0.0.7 typing-inspection==0.4.5 \
#       uvicorn==0.55.0 opentelemetry-api==1.45.2 soundfile==0.13.1 cffi==2.1.1 pycparser==3.12
# (Or carry .sglang-stage too: its site.tar.xz, docs/real-sglang.md, has the refserver's fastapi and uvicorn.)
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/fsite
for wheel in .device/fleet-wheels/*.whl; do python3 -m zipfile -e "$wheel" /tmp/fsite; done
# The plugin's entry point, as `pip install` would register it (the checkout is imported from PYTHONPATH).
mkdir -p /tmp/fsite/pytest_dflash-0.1.0.dist-info
printf 'Metadata-Version: 2.1\nName: pytest-dflash\nVersion: 0.1.0\n' > /tmp/fsite/pytest_dflash-0.1.0.dist-info/METADATA
printf '[pytest11]\ndflash = pytest_dflash.plugin\n' > /tmp/fsite/pytest_dflash-0.1.0.dist-info/entry_points.txt
if [ -f .sglang-stage/site.tar.xz ]; then
  [ -f /tmp/site/.unpacked ] || { tar -C /tmp -xJf .sglang-stage/site.tar.xz && touch /tmp/site/.unpacked; } || exit 1
fi
export PYTHONPATH=/tmp/fsite:$PWD:/tmp/site
{
  echo "cpus: $(nproc); load: $(cat /proc/loadavg)"
  lscpu | grep -E 'Model name|^CPU\(s\)|Thread' || true
  python3 -c 'import sys, pytest, xdist, testinfra, httpx, fastapi, uvicorn, soundfile, torch; print(sys.version.split()[0], "pytest", pytest.__version__, "xdist", xdist.__version__, "httpx", httpx.__version__, "torch", torch.__version__)'
} > "$OUT/machine.txt" 2>&1
# What 32 hosts probing one GPU cost: nvidia-smi -q -x once, then 8 at once (the pre-flight's concurrency).
if command -v nvidia-smi >/dev/null; then
  for n in 1 8; do
    start=$(date +%s.%N)
    for i in $(seq "$n"); do nvidia-smi -q -x > /dev/null & done; wait
    echo "nvidia-smi -q -x, $n at once: $(python3 -c "import time; print(round(time.time() - $start, 2))") s"
  done >> "$OUT/machine.txt"
fi
cat "$OUT/machine.txt"
PY=$(command -v python3)
pinned=(--runner-cpus 0,1 --host-cpus 2-15 --memo --host-python "$PY" --no-serial --merge 0 --workers 2)
# FLEET_EXTRA (optional): more fleet_scale.py flags for every series, e.g. "--hosts-without-gpu"; REPEAT: repeats
# per series (3); NO256=1: no 256-host run.
read -r -a extra <<< "${FLEET_EXTRA:-}"
# BEFORE=DIR (optional): an older tree (`git archive REV pytest_dflash suites conftest.py pyproject.toml`, plus
# this checkout's benchmarks/fleet_scale.py and memo_proxy.py in DIR/benchmarks), measured between the series.
for series in 1 before 2; do
  root=$PWD
  if [ "$series" = before ]; then
    [ -n "${BEFORE:-}" ] && [ -d "$BEFORE" ] || continue
    root=$(cd "$BEFORE" && pwd)
  fi
  (cd "$root" && PYTHONPATH=/tmp/fsite:$root:/tmp/site timeout 240 python3 benchmarks/fleet_scale.py "${pinned[@]}" \
     --repeat "${REPEAT:-3}" "${extra[@]}" --json "$OUT/fleet32-s$series.json") > "$OUT/fleet32-s$series.log" 2>&1
  echo "series $series ($root): rc $?"; grep -E '^  -n' "$OUT/fleet32-s$series.log"
done
[ -n "${NO256:-}" ] && exit 0
timeout 200 python3 benchmarks/fleet_scale.py "${pinned[@]}" --hosts 256 --repeat 1 --no-one-host "${extra[@]}" \
  --json "$OUT/fleet256.json" > "$OUT/fleet256.log" 2>&1
echo "256 hosts: rc $?"; grep -E '^  -n' "$OUT/fleet256.log"
