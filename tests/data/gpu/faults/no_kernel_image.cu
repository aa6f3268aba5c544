// Built for sm_80 only (no PTX) and run on an sm_90 GPU: the launch fails with the CUDA runtime's
// "no kernel image is available for execution on the device"; on a host without a driver the first
// call fails with "CUDA driver version is insufficient for CUDA runtime version" (both recorded in
// this folder, see docs/gpu-layers.md).
#include <cstdio>
#include <cuda_runtime.h>
__global__ void k(int *x) { x[0] = 1; }
int main() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  printf("cudaGetDeviceCount: %s (%d): %s\n", cudaGetErrorName(e), (int)e, cudaGetErrorString(e));
  if (e != cudaSuccess) return 1;
  int *d; cudaMalloc(&d, 4); k<<<1, 1>>>(d);
  e = cudaGetLastError();
  printf("launch: %s (%d): %s\n", cudaGetErrorName(e), (int)e, cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 2;
}
