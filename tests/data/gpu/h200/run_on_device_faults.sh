#!/usr/bin/env bash
# Real failure texts for the diagnosis catalog, recorded ON the H200 (run from the repo root with .whl/
# and .gpu-stage2/sgk047.tar.xz carried: sglang-kernel 0.4.7 = a torch 2.13 build, sm90 only):
#   1. the env layer on a venv whose sgl_kernel was built for another torch (seed 002's ABI split);
#   2. a CUDA binary with sm_80 code only, launched on sm_90 ("no kernel image is available");
#   3. a Triton kernel that does not compile (CompilationError).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/faults"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/ctl .whl/*.whl || exit 1
mkdir -p /tmp/sgk047 && tar -C /tmp/sgk047 -xJf .gpu-stage2/sgk047.tar.xz || exit 1
PYTHONPATH="$PWD:/tmp/ctl" PYTHONUNBUFFERED=1 timeout 200 python3 -m pytest -p pytest_dflash.plugin -p no:cacheprovider -rA \
  --host tests/data/gpu/h200/profile-torch-abi-split.toml suites/env -k "test_import_chain and sgl_kernel or satisfy" \
  --dflash-probe-dump "$OUT/faults" --dflash-report "$OUT/faults" > "$OUT/faults/pytest-abi-split.log" 2>&1
tail -25 "$OUT/faults/pytest-abi-split.log"
nvcc -gencode arch=compute_80,code=sm_80 -o /tmp/no_kernel_image tests/data/gpu/faults/no_kernel_image.cu \
  && /tmp/no_kernel_image > "$OUT/faults/no_kernel_image.txt" 2>&1; echo "rc=$?" >> "$OUT/faults/no_kernel_image.txt"
cat "$OUT/faults/no_kernel_image.txt"
TRITON_CACHE_DIR=$(mktemp -d) timeout 120 python3 tests/data/gpu/faults/triton_bad_kernel.py > "$OUT/faults/triton_compile_error.txt" 2>&1
echo "rc=$?" >> "$OUT/faults/triton_compile_error.txt"; tail -12 "$OUT/faults/triton_compile_error.txt"
tar -czf "$OUT/h200-faults.tar.gz" -C "$OUT" faults && rm -rf "$OUT/faults"; ls -la "$OUT"
