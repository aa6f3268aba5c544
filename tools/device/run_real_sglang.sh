#!/usr/bin/env bash
# ON THE GPU MACHINE, from the repo root: real SGLang 0.5.17 (plain + DFLASH) provisioned by pytest-dflash
# (tools/device/h200.toml), then the suites against it. Outputs go to $OUT. See docs/real-sglang.md.
# Needs, carried along (git-ignored): .sglang-stage/ (site.tar.xz: sglang 0.5.17 + deps for cp312, and
# make_models.py, staged from PyPI on a machine with network) and .device/wheels/ (pytest-testinfra).
# DRAFTS=1 (the default when $PROFILE serves /tmp/models/eagle, eagle3 or standalone, e.g. h200-eagle3.toml)
# also builds the EAGLE and EAGLE-3 heads and the STANDALONE draft from the target (tools/device/make_spec_drafts.py).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
[ -f /tmp/site/.unpacked ] || { tar -C /tmp -xJf .sglang-stage/site.tar.xz && touch /tmp/site/.unpacked; } || exit 1
echo "[dev] unpacked at $(el)s"
PYTHONPATH=/tmp/site python3 .sglang-stage/make_models.py /tmp/models > "$OUT/models.txt" 2>&1 || { cat "$OUT/models.txt"; exit 1; }
echo "[dev] models at $(el)s"
DRAFTS=${DRAFTS:-$(grep -qE '/tmp/models/(eagle|eagle3|standalone)' "${PROFILE:-tools/device/h200.toml}" && echo 1 || echo 0)}
if [ "$DRAFTS" = 1 ]; then
    PYTHONPATH=/tmp/site python3 tools/device/make_spec_drafts.py /tmp/models/target /tmp/models --check \
        --sglang-src /tmp/site > "$OUT/drafts.txt" 2>&1 || { cat "$OUT/drafts.txt"; exit 1; }
    echo "[dev] drafts at $(el)s"
fi
mkdir -p /tmp/plugin-site && for w in .device/wheels/*.whl; do python3 -m zipfile -e "$w" /tmp/plugin-site; done
# /tmp/site last: the structured checks need jsonschema and xgrammar, which the image lacks; the image's own
# packages (httpx, pytest, torch) still come first
export PYTHONPATH=/tmp/plugin-site:$PWD:/tmp/site
export DFLASH_STATE_DIR=/tmp/dflash-state
python3 -c 'import pytest, testinfra, httpx; print("pytest", pytest.__version__)'
if [ "${RECORD_STRUCTURED:-0}" = 1 ]; then  # issue 33: SGLang's raw answers to constrained requests, server by server
    PYTHONPATH=/tmp/site timeout ${RECORD_BUDGET:-900} python3 tools/device/record_structured.py "$OUT/structured" \
        > "$OUT/structured.txt" 2>&1; echo "[dev] structured recordings rc=$? at $(el)s"; cat "$OUT/structured.txt"
    # one archive: the run tool returns at most 8 files from $OUT (a 9th, plain.json, was dropped once)
    ls -la "$OUT/structured"; tar -czf "$OUT/structured.tar.gz" -C "$OUT" structured && rm -rf "$OUT/structured"
    [ "${RECORD_ONLY:-0}" = 1 ] && exit 0  # the suites in a second call (10 min each)
fi
SUITES=${SUITES:-"suites/smoke suites/generation suites/parity"}
timeout ${BUDGET:-480} python3 -m pytest -p pytest_dflash.plugin -p no:cacheprovider --host ${PROFILE:-tools/device/h200.toml} $SUITES \
    --dflash-report "$OUT" --junitxml "$OUT/junit.xml" -rA --durations=15 ${EXTRA:-} > "$OUT/pytest.log" 2>&1
rc=$?
echo "[dev] pytest rc=$rc at $(el)s"
tail -60 "$OUT/pytest.log"
tar -czf "$OUT/server-logs.tar.gz" -C /tmp/dflash-state logs 2>/dev/null
ls -la "$OUT"
