#!/usr/bin/env bash
# How tests/data/gpu/cpu-nvcc13/ was recorded on the project's CPU machine (2 cores, no GPU, no driver,
# nvcc 13.0 at /usr/local/cuda-13.0 behind a /usr/local/bin/nvcc wrapper), with the project venv
# (flashinfer-python 0.7.2.post1, torch 2.13.0+cpu, nvidia-curand 10.4.5.25). Run from the repo root.
set -eu
PY=${PY:-.venv/bin/python}
HERE=tests/data/gpu/cpu-nvcc13
CURAND_INCLUDE=$($PY -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "include"))')
$PY pytest_dflash/probes/cuda_toolkit.py > $HERE/cuda_toolkit.json
$PY pytest_dflash/probes/kernel_log.py > $HERE/kernel_log.json
$PY pytest_dflash/probes/gpu_inventory.py > $HERE/gpu_inventory.json
# FlashInfer's sampling JIT for 9.0 as the machine is: curand.h is missing
$PY pytest_dflash/probes/kernels.py '{"step": "sampling", "mode": "compile", "arch_list": "9.0", "jobs": 2}' \
  > $HERE/kernels_sampling_no_curand.json
# ... with nvidia-curand's headers on CPATH: every object compiles, the link cannot find -lcudart / -lcuda
CPATH=$CURAND_INCLUDE $PY pytest_dflash/probes/kernels.py '{"step": "sampling", "mode": "compile", "arch_list": "9.0", "jobs": 2}' \
  > $HERE/kernels_sampling_cpath.json
# an arch FlashInfer refuses: its real "FlashInfer requires GPUs with sm75 or higher"
$PY pytest_dflash/probes/kernels.py '{"step": "sampling", "mode": "compile", "arch_list": "7.0"}' > $HERE/kernels_sampling_sm70.json
# the import chains of an SGLang service in a venv without sglang, and of the refserver
$PY pytest_dflash/probes/import_chain.py '{"chains": [{"name": "grammar", "modules": ["sglang.srt.server_args"]},
  {"name": "flashinfer", "modules": ["flashinfer", "flashinfer.sampling"]},
  {"name": "refserver_http", "modules": ["pytest_dflash.refserver.server"]}]}' > $HERE/import_chain.json
# the CUDA runtime on a machine without a driver
nvcc -gencode arch=compute_80,code=sm_80 -o /tmp/no_kernel_image tests/data/gpu/faults/no_kernel_image.cu
{ /tmp/no_kernel_image; echo "rc=$?"; } > $HERE/no_driver.txt 2>&1 || true
