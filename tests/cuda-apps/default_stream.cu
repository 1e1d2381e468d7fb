// The legacy default stream's implicit synchronization (built WITHOUT --default-stream
// per-thread): work on stream 0 waits for all earlier work on blocking streams, and blocking
// streams wait for earlier stream-0 work. Non-blocking streams take no part in it; the only
// deterministic consequence is that their results stay right whatever runs beside them.
#include "common.h"

static const int N = 1 << 16;

// out[i] = in[i] + 1 if in[i] has the value the producer wrote, else -1 (the order was broken).
__global__ void follow(const int *in, int *out, int n, int mul, int add) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] == i * mul + add ? in[i] + 1 : -1;
}

int main() {
  int *a, *b, *c;
  CK(cudaMalloc(&a, N * sizeof(int)));
  CK(cudaMalloc(&b, N * sizeof(int)));
  CK(cudaMalloc(&c, N * sizeof(int)));
  CK(cudaMemset(a, 0, N * sizeof(int)));
  CK(cudaMemset(b, 0, N * sizeof(int)));
  CK(cudaMemset(c, 0, N * sizeof(int)));
  CK(cudaDeviceSynchronize());

  cudaStream_t blocking1, blocking2, nonblocking;
  CK(cudaStreamCreate(&blocking1));
  CK(cudaStreamCreateWithFlags(&blocking2, cudaStreamDefault));
  CK(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking));
  unsigned flags = 99;
  CK(cudaStreamGetFlags(nonblocking, &flags));
  check(flags == cudaStreamNonBlocking, "nonblocking_flag_reported");

  for (int round = 0; round < 8; round++) {
    // blocking1: long spin, then a = 3i + round.
    spin(blocking1, round == 0 ? 100.0 : 10.0);
    iota<<<blocks_for(N), 256, 0, blocking1>>>(a, N, 3, round);
    // stream 0 (legacy): must see a complete -> b = a + 1.
    follow<<<blocks_for(N), 256>>>(a, b, N, 3, round);
    // blocking2: must see stream 0's b -> c = b + 1 (checked against 3i + round + 1).
    follow<<<blocks_for(N), 256, 0, blocking2>>>(b, c, N, 3, round + 1);
    CK(cudaStreamSynchronize(blocking2));
    std::vector<int> v = to_host(c, N);
    char name[64];
    snprintf(name, sizeof name, "legacy_implicit_sync_round_%d", round);
    expect_affine(v, 3, round + 2, name);
    g_digest.add_vec(v);
  }

  // The explicit handle cudaStreamLegacy behaves like stream 0.
  spin(blocking1, 50.0);
  iota<<<blocks_for(N), 256, 0, blocking1>>>(a, N, 5, 1);
  follow<<<blocks_for(N), 256, 0, cudaStreamLegacy>>>(a, b, N, 5, 1);
  CK(cudaStreamSynchronize(cudaStreamLegacy));
  std::vector<int> v = to_host(b, N);
  expect_affine(v, 5, 2, "cudaStreamLegacy_implicit_sync");
  g_digest.add_vec(v);

  // Work on stream 0 waits for the blocking streams' earlier work (the legacy stream's barrier),
  // so synchronizing stream 0 after an empty kernel on it covers that work.
  int *flag_d;
  volatile int *flag = mapped_alloc<int>(1, &flag_d);
  spin(blocking2, 80.0, flag_d, 1);
  spin(0, 0.0);
  CK(cudaStreamSynchronize(0));
  check(*flag == 1, "stream0_sync_waits_for_blocking_streams");

  // Non-blocking stream: its own chain is ordered and right while stream 0 and blocking streams
  // are busy. (Whether it overlapped them is timing: a note only.)
  int *d;
  CK(cudaMalloc(&d, N * sizeof(int)));
  int *nb_done_d;
  volatile int *nb_done = mapped_alloc<int>(1, &nb_done_d);
  int *s0_done_d;
  volatile int *s0_done = mapped_alloc<int>(1, &s0_done_d);
  spin(0, 200.0, s0_done_d, 1);
  iota<<<blocks_for(N), 256, 0, nonblocking>>>(d, N, 7, 3);
  affine<<<blocks_for(N), 256, 0, nonblocking>>>(d, d, N, 1, 1);
  spin(nonblocking, 0.0, nb_done_d, 1);
  CK(cudaStreamSynchronize(nonblocking));
  note("non-blocking stream finished %s the 200 ms legacy-stream kernel", *s0_done ? "after" : "before");
  (void)nb_done;
  v = to_host(d, N);  // cudaMemcpy on the legacy stream: waits for the legacy kernel too
  check(*s0_done == 1, "sync_memcpy_waits_for_legacy_stream");
  expect_affine(v, 7, 4, "nonblocking_results");
  g_digest.add_vec(v);

  CK(cudaStreamDestroy(blocking1));
  CK(cudaStreamDestroy(blocking2));
  CK(cudaStreamDestroy(nonblocking));
  return finish();
}
