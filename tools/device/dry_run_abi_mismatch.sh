#!/usr/bin/env bash
# HERE, without a GPU: tools/device/run_abi_mismatch.sh against the same staged files, with a second venv's torch
# 2.11.0 as the profile's python (the device's own build, cu130, installed --no-deps: it does not import here,
# its CUDA libraries are not installed; its metadata is real). Nothing is started either way.
#   python3 -m venv .venv-t211 && .venv-t211/bin/pip install --no-deps torch==2.11.0 && \
#   .venv-t211/bin/pip install typing_extensions filelock sympy networkx jinja2 fsspec
#   bash tools/device/dry_run_abi_mismatch.sh        # -> /tmp/abi-dry (OUT)
set -u
SERVICE_PYTHON=${SERVICE_PYTHON:-$PWD/.venv-t211/bin/python}
profile=${TMPDIR:-/tmp}/h200-abi-local.toml
# the profile's python -> the second venv; no `gpus` (no nvidia-smi here: the host layer would fail first)
sed -e "s|^python = \"python3\"|python = \"$SERVICE_PYTHON\"|" -e '/^gpus = /d' tools/device/h200-abi.toml > "$profile"
OUT=${OUT:-/tmp/abi-dry} PYTHON=${PYTHON:-$PWD/.venv/bin/python} SERVICE_PYTHON=$SERVICE_PYTHON PROFILE=$profile PLUGIN= \
    DFLASH_STATE_DIR=${DFLASH_STATE_DIR:-/tmp/dflash-state-abi} bash tools/device/run_abi_mismatch.sh
