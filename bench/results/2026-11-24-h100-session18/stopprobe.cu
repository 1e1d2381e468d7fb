// When does a flag set mid-kernel stop it? A kernel of 40 waves of 50 us blocks (2 of 1024 threads per SM)
// on a low-priority stream; each block reads the flag at its start, exits if it is set, else
// spins and counts itself. 700 us in, the flag is set from a highest-priority stream, by a copy
// from pinned memory (cuMemcpyHtoDAsync, the copy engine) or by a memset (cuMemsetD32Async;
// "memset" makes one memset before the first round, "memset-first" none, so that its first
// round's set is the process's first memset).
// Printed: blocks run (of all), and when the set was done on the GPU (an event behind it) and
// when the kernel ended, from an event recorded on the control stream just before the set. Build: nvcc -O2 -o stopprobe stopprobe.cu -lcuda
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <cuda.h>
#include <cuda_runtime.h>

__global__ void guarded(const volatile int* flag, unsigned* ran, unsigned long long ns) {
  __shared__ int stop;
  if (threadIdx.x == 0) stop = *flag;
  __syncthreads();
  if (stop) return;
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
  if (threadIdx.x == 0) atomicAdd(ran, 1u);
}

static void check(cudaError_t e, const char* w) {
  if (e != cudaSuccess) { fprintf(stderr, "%s: %s\n", w, cudaGetErrorString(e)); exit(1); }
}

int main(int argc, char** argv) {
  const char* how = argc > 1 ? argv[1] : "copy";
  const char* tag = argc > 2 ? argv[2] : "run";
  int lo, hi, sms;
  check(cudaDeviceGetStreamPriorityRange(&lo, &hi), "range");
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaStream_t work, ctl;
  check(cudaStreamCreateWithPriority(&work, cudaStreamNonBlocking, lo), "stream");
  check(cudaStreamCreateWithPriority(&ctl, cudaStreamNonBlocking, hi), "stream");
  int* flag; unsigned* ran; int* one;
  check(cudaMalloc(&flag, 4), "malloc"); check(cudaMalloc(&ran, 4), "malloc");
  check(cudaMallocHost(&one, 4), "host"); *one = 1;
  cudaEvent_t before, set_done, work_done;
  cudaEventCreate(&before); cudaEventCreate(&set_done); cudaEventCreate(&work_done);
  if (!strcmp(how, "memset")) {
    if (cuMemsetD32Async((CUdeviceptr)flag, 0, 1, (CUstream)ctl) != CUDA_SUCCESS) return 1;
    check(cudaDeviceSynchronize(), "sync");
  }
  for (int round = 0; round < 3; round++) {
    // Zeroed by copies: with "memset-first" the timed set is the process's first memset.
    static const unsigned zero[1] = {0};
    cudaMemcpy(flag, zero, 4, cudaMemcpyHostToDevice);
    cudaMemcpy(ran, zero, 4, cudaMemcpyHostToDevice);
    unsigned blocks = sms * 2 * 40;
    guarded<<<blocks, 1024, 0, work>>>(flag, ran, 50000);
    cudaEventRecord(work_done, work);
    std::this_thread::sleep_for(std::chrono::microseconds(700));
    cudaEventRecord(before, ctl);
    CUresult r = strncmp(how, "memset", 6) == 0
        ? cuMemsetD32Async((CUdeviceptr)flag, 1, 1, (CUstream)ctl)
        : cuMemcpyHtoDAsync((CUdeviceptr)flag, one, 4, (CUstream)ctl);
    if (r != CUDA_SUCCESS) { fprintf(stderr, "set: %d\n", (int)r); return 1; }
    cudaEventRecord(set_done, ctl);
    check(cudaDeviceSynchronize(), "sync");
    unsigned n = 0;
    cudaMemcpy(&n, ran, 4, cudaMemcpyDeviceToHost);
    float set_ms = 0, end_ms = 0;
    cudaEventElapsedTime(&set_ms, before, set_done);
    cudaEventElapsedTime(&end_ms, before, work_done);
    printf("{\"tag\":\"%s\",\"how\":\"%s\",\"round\":%d,\"blocks\":%u,\"ran\":%u,"
           "\"set_done_us\":%.1f,\"kernel_end_us\":%.1f}\n",
           tag, how, round, blocks, n, set_ms * 1e3, end_ms * 1e3);
  }
  return 0;
}
