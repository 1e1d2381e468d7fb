// Stream-ordered allocation: cudaMallocAsync / cudaFreeAsync behind long work, memory freed on
// one stream and reallocated on another (ordered by an event; the pool may hand back the same
// block, so a reordering shows up as corrupted results), many alloc/free cycles, an explicit
// pool, and a trim while nothing is in use.
#include "common.h"

static const int N = 1 << 16;

int main() {
  cudaStream_t a, b;
  CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  int *out;
  CK(cudaMalloc(&out, N * sizeof(int)));

  // 1. Alloc, use and free on one stream, behind a long spin; a second allocation of the same
  // size on the same stream may reuse the block: its contents are ours only after our writes.
  spin(a, 100.0);
  int *p;
  CK(cudaMallocAsync(&p, N * sizeof(int), a));
  iota<<<blocks_for(N), 256, 0, a>>>(p, N, 2, 0);
  affine<<<blocks_for(N), 256, 0, a>>>(p, out, N, 1, 1);  // out = 2i + 1
  CK(cudaFreeAsync(p, a));
  int *q;
  CK(cudaMallocAsync(&q, N * sizeof(int), a));
  iota<<<blocks_for(N), 256, 0, a>>>(q, N, 0, 5);
  affine<<<blocks_for(N), 256, 0, a>>>(q, q, N, 3, 0);  // q = 15
  std::vector<int> v(N);
  CK(cudaMemcpyAsync(v.data(), q, N * sizeof(int), cudaMemcpyDeviceToHost, a));
  CK(cudaFreeAsync(q, a));
  CK(cudaStreamSynchronize(a));
  expect_affine(v, 0, 15, "reused_block_results");
  CK(cudaMemcpy(v.data(), out, N * sizeof(int), cudaMemcpyDeviceToHost));
  expect_affine(v, 2, 1, "first_block_results");
  g_digest.add_vec(v);

  // 2. Cross-stream: a frees after its (long) use; b allocates after waiting for a's event, and
  // overwrites. If b's writes ran before a's reads, out would see b's values.
  cudaEvent_t e;
  CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  long long total_bad = 0;
  for (int round = 0; round < 20; round++) {
    int *x;
    CK(cudaMallocAsync(&x, N * sizeof(int), a));
    iota<<<blocks_for(N), 256, 0, a>>>(x, N, 1, round);
    if (round % 5 == 0) spin(a, 20.0);
    affine<<<blocks_for(N), 256, 0, a>>>(x, out, N, 1, 0);  // out = i + round
    CK(cudaFreeAsync(x, a));
    CK(cudaEventRecord(e, a));
    CK(cudaStreamWaitEvent(b, e, 0));
    int *y;
    CK(cudaMallocAsync(&y, N * sizeof(int), b));
    iota<<<blocks_for(N), 256, 0, b>>>(y, N, 0, -1);
    CK(cudaFreeAsync(y, b));
    CK(cudaStreamSynchronize(b));
    CK(cudaStreamSynchronize(a));
    CK(cudaMemcpy(v.data(), out, N * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; i++) total_bad += v[i] != i + round;
    g_digest.add_vec(v);
  }
  check(total_bad == 0, "cross_stream_free_realloc_ordered", "%lld wrong elements", total_bad);

  // 3. An explicit pool with a release threshold, many cycles, then trim.
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool;
  CK(cudaMemPoolCreate(&pool, &props));
  unsigned long long threshold = 64ull << 20;
  CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  for (int k = 0; k < 200; k++) {
    int *t;
    CK(cudaMallocFromPoolAsync(&t, (size_t)(k % 7 + 1) * N * sizeof(int), pool, b));
    iota<<<blocks_for(N), 256, 0, b>>>(t, N, 1, k);
    CK(cudaMemcpyAsync(out, t, N * sizeof(int), cudaMemcpyDeviceToDevice, b));
    CK(cudaFreeAsync(t, b));
  }
  CK(cudaMemcpyAsync(v.data(), out, N * sizeof(int), cudaMemcpyDeviceToHost, b));
  CK(cudaStreamSynchronize(b));
  expect_affine(v, 1, 199, "pool_cycles_last_result");
  g_digest.add_vec(v);
  CK(cudaMemPoolTrimTo(pool, 0));
  unsigned long long reserved = 1;
  CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  check(reserved == 0, "pool_trimmed_to_zero", "%llu bytes still reserved", reserved);
  CK(cudaMemPoolDestroy(pool));
  CK(cudaStreamDestroy(a));
  CK(cudaStreamDestroy(b));
  return finish();
}
