// How cudaDeviceReset (CUDA runtime linked statically) reaches the driver: work in flight on a
// non-blocking stream, markers on stderr (unbuffered, the shim's log goes there too) around the
// reset, then CUDA used again.
#include <cuda_runtime.h>
#include <cstdio>
__global__ void spin(long long cycles) {
  long long t = clock64();
  while (clock64() - t < cycles) {}
}
int main() {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  for (int i = 0; i < 8; i++) spin<<<1, 1, 0, s>>>(2000000);
  fprintf(stderr, "== before cudaDeviceReset\n");
  cudaError_t e = cudaDeviceReset();
  fprintf(stderr, "== after cudaDeviceReset: %d\n", (int)e);
  spin<<<1, 1>>>(1000);
  e = cudaDeviceSynchronize();
  fprintf(stderr, "== after relaunch: %d\n", (int)e);
  return (int)e;
}
