// Work for the RM hooks' checks: a process that creates a CUDA context and keeps the GPU busy
// with kernels of known work, then checks every result. One JSON line on stdout.
//
//   spin --mode share --seconds 3 [--go-at-ms T] [--wait-file F]   full-GPU kernels back to back
//   spin --mode small --seconds 3                                    1-block kernels, synced each
//   spin --mode train --seconds 3                                    long full-GPU kernels
//
// --wait-file F: wait for F to exist before touching CUDA (so an operator can configure the
// policy for this pid first). --go-at-ms T: after the context exists, start the busy phase at
// wall-clock time T (ms since the epoch), so that two processes start together.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static double now_ms() {
  struct timeval tv;
  gettimeofday(&tv, 0);
  return tv.tv_sec * 1e3 + tv.tv_usec / 1e3;
}

__global__ void lcg(unsigned *out, unsigned iters, unsigned seed) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned x = seed + i;
  for (unsigned k = 0; k < iters; k++) x = x * 1664525u + 1013904223u;
  out[i] = x;
}

static unsigned host_lcg(unsigned x, unsigned iters) {
  for (unsigned k = 0; k < iters; k++) x = x * 1664525u + 1013904223u;
  return x;
}

#define CK(call)                                                                        \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      printf("{\"pid\": %d, \"error\": \"%s at %s\"}\n", getpid(), cudaGetErrorString(e_), #call); \
      return 2;                                                                         \
    }                                                                                   \
  } while (0)

int main(int argc, char **argv) {
  const char *mode = "share", *wait_file = 0;
  double seconds = 3, go_at = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--mode")) mode = argv[i + 1];
    else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--go-at-ms")) go_at = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--wait-file")) wait_file = argv[i + 1];
  }
  // share: batches of 64 kernels (~6 ms), the next queued before the last is waited for, so the
  // process always has work pending and only the driver's timeslice switches it out.
  unsigned blocks = 132 * 8, threads = 256, iters = 20000, per_sync = 64, ahead = 1;
  if (!strcmp(mode, "small")) { blocks = 1; threads = 32; iters = 200; per_sync = 1; ahead = 0; }
  if (!strcmp(mode, "train")) { iters = 6000000; per_sync = 1; ahead = 0; }
  double t_start = now_ms();
  if (wait_file)
    while (access(wait_file, F_OK) != 0) usleep(2000);
  double t_released = now_ms();
  CK(cudaFree(0));  // the context: its channel groups, SET_TIMESLICE, GPFIFO_SCHEDULE
  double t_ctx = now_ms();
  unsigned n = blocks * threads, *d = 0;
  CK(cudaMalloc(&d, n * sizeof(unsigned)));
  if (go_at > 0)
    while (now_ms() < go_at) usleep(200);
  double t_busy = now_ms(), t_first = 0;
  unsigned long long kernels = 0, queued = 0;
  unsigned seed = 1;
  cudaEvent_t done[2];
  CK(cudaEventCreateWithFlags(&done[0], cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&done[1], cudaEventDisableTiming));
  unsigned long long batch = 0;
  while (now_ms() - t_busy < seconds * 1e3) {
    for (unsigned k = 0; k < per_sync; k++) lcg<<<blocks, threads>>>(d, iters, ++seed);
    CK(cudaEventRecord(done[batch % 2]));
    queued += per_sync;
    if (batch >= ahead) {
      // Wait for the batch before this one (or this one, without look-ahead).
      CK(cudaEventSynchronize(done[(batch - ahead) % 2]));
      kernels = queued - (unsigned long long)ahead * per_sync;
      if (!t_first) t_first = now_ms();
    }
    batch++;
  }
  CK(cudaDeviceSynchronize());
  double t_end = now_ms();
  CK(cudaGetLastError());
  // The last kernel's results, checked on the host (a sample of threads).
  unsigned *h = (unsigned *)malloc(n * sizeof(unsigned));
  CK(cudaMemcpy(h, d, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
  int ok = 1;
  for (unsigned i = 0; i < n; i += (n > 64 ? n / 64 : 1))
    if (h[i] != host_lcg(seed + i, iters)) ok = 0;
  printf("{\"pid\": %d, \"mode\": \"%s\", \"kernels\": %llu, \"busy_ms\": %.1f, \"rate_per_s\": %.1f, "
         "\"ok\": %s, \"t_start_ms\": %.1f, \"t_released_ms\": %.1f, \"t_ctx_ms\": %.1f, "
         "\"ctx_create_ms\": %.1f, \"t_busy_ms\": %.1f, \"t_first_done_ms\": %.1f, \"t_end_ms\": %.1f}\n",
         getpid(), mode, kernels, t_end - t_busy, kernels / ((t_end - t_busy) / 1e3), ok ? "true" : "false",
         t_start, t_released, t_ctx, t_ctx - t_released, t_busy, t_first, t_end);
  fflush(stdout);
  cudaFree(d);
  free(h);
  return ok ? 0 : 1;
}
