// Destroying things while work is queued: cudaStreamDestroy with pending work (returns at once;
// the work still completes), cudaEventDestroy of an event whose record is pending, and
// cudaDeviceReset with pending work (the work goes first: its results land in host memory that
// outlives the reset).
#include "common.h"

#include <sys/mman.h>

static const int N = 1 << 16;

int main() {
  int *a;
  CK(cudaMalloc(&a, N * sizeof(int)));
  int *out_d;
  int *out = mapped_alloc<int>(N, &out_d);

  // 1. Stream destroyed with a long chain queued: the chain completes, in order.
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  spin(s, 100.0);
  iota<<<blocks_for(N), 256, 0, s>>>(a, N, 3, 3);
  for (int i = 0; i < 100; i++) add_all<<<blocks_for(N), 256, 0, s>>>(a, N, 1);
  affine<<<blocks_for(N), 256, 0, s>>>(a, out_d, N, 1, 0);
  CK(cudaStreamDestroy(s));
  CK(cudaDeviceSynchronize());
  std::vector<int> v(out, out + N);
  expect_affine(v, 3, 103, "stream_destroy_with_pending_work");
  g_digest.add_vec(v);

  // 2. Many streams created, fed and destroyed in a loop without any sync in between.
  int *acc;
  CK(cudaMalloc(&acc, N * sizeof(int)));
  CK(cudaMemset(acc, 0, N * sizeof(int)));
  cudaEvent_t prev = nullptr;
  for (int k = 0; k < 64; k++) {
    cudaStream_t t;
    CK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    if (prev) {
      CK(cudaStreamWaitEvent(t, prev, 0));
      CK(cudaEventDestroy(prev));  // 3. event destroyed while a wait on it may still be pending
    }
    if (k % 16 == 0) spin(t, 10.0);
    add_all<<<blocks_for(N), 256, 0, t>>>(acc, N, k);
    CK(cudaEventCreateWithFlags(&prev, cudaEventDisableTiming));
    CK(cudaEventRecord(prev, t));
    CK(cudaStreamDestroy(t));
  }
  CK(cudaDeviceSynchronize());
  CK(cudaEventDestroy(prev));
  v = to_host(acc, N);
  expect_affine(v, 0, 63 * 64 / 2, "stream_chain_destroyed_each_step");
  g_digest.add_vec(v);

  // 4. cudaDeviceReset with pending work. The results go to plain host memory registered as
  // mapped (so it outlives the reset, which unregisters it); the reset must let the work finish.
  int *host = (int *)mmap(nullptr, N * sizeof(int), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (host == MAP_FAILED) return 3;
  memset(host, 0, N * sizeof(int));
  CK(cudaHostRegister(host, N * sizeof(int), cudaHostRegisterMapped));
  int *host_d;
  CK(cudaHostGetDevicePointer((void **)&host_d, host, 0));
  cudaStream_t r;
  CK(cudaStreamCreateWithFlags(&r, cudaStreamNonBlocking));
  spin(r, 150.0);
  iota<<<blocks_for(N), 256, 0, r>>>(host_d, N, 17, 4);
  CK(cudaDeviceReset());
  v.assign(host, host + N);
  expect_affine(v, 17, 4, "device_reset_lets_pending_work_finish");
  g_digest.add_vec(v);

  // 5. CUDA is usable again after the reset.
  int *z;
  CK(cudaMalloc(&z, N * sizeof(int)));
  iota<<<blocks_for(N), 256>>>(z, N, 1, 1);
  v = to_host(z, N);
  expect_affine(v, 1, 1, "usable_after_reset");
  CK(cudaFree(z));
  munmap(host, N * sizeof(int));
  return finish();
}
