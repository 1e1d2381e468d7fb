// Synchronous and "asynchronous but really synchronous" memory operations after queued async
// work: cudaMemcpy / cudaMemset on the legacy stream, cudaMemcpyAsync from and to PAGEABLE host
// memory (returns only once the source is staged / the destination is written), cudaFree and
// cudaFreeHost of buffers that queued work still uses (both wait for the device), and
// cudaMemcpyAsync between pinned buffers ordered with kernels.
#include "common.h"

static const int N = 1 << 18;

int main() {
  cudaStream_t s;  // blocking: takes part in the legacy stream's barrier
  CK(cudaStreamCreate(&s));
  int *a, *b;
  CK(cudaMalloc(&a, N * sizeof(int)));
  CK(cudaMalloc(&b, N * sizeof(int)));

  // 1. cudaMemcpy D2H after long async work on a blocking stream sees that work.
  spin(s, 100.0);
  iota<<<blocks_for(N), 256, 0, s>>>(a, N, 2, 9);
  std::vector<int> v(N);
  CK(cudaMemcpy(v.data(), a, N * sizeof(int), cudaMemcpyDeviceToHost));
  expect_affine(v, 2, 9, "sync_memcpy_after_async_kernel");
  g_digest.add_vec(v);

  // 2. cudaMemset (legacy stream) after an async kernel that writes the same buffer: the memset
  // lands last.
  spin(s, 50.0);
  iota<<<blocks_for(N), 256, 0, s>>>(a, N, 1, 1);
  CK(cudaMemset(a, 0, N * sizeof(int)));
  CK(cudaMemcpy(v.data(), a, N * sizeof(int), cudaMemcpyDeviceToHost));
  expect_affine(v, 0, 0, "sync_memset_after_async_kernel");

  // 3. cudaMemcpy H2D (sync) overwrites what queued async work would otherwise read later: the
  // kernel queued before the copy reads the OLD contents.
  iota<<<blocks_for(N), 256, 0, s>>>(a, N, 1, 0);
  spin(s, 50.0);
  affine<<<blocks_for(N), 256, 0, s>>>(a, b, N, 3, 0);  // b = 3i (reads a before the copy)
  std::vector<int> h(N, 5);
  CK(cudaMemcpy(a, h.data(), N * sizeof(int), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(v.data(), b, N * sizeof(int), cudaMemcpyDeviceToHost));
  expect_affine(v, 3, 0, "queued_kernel_reads_before_sync_copy");
  g_digest.add_vec(v);
  CK(cudaMemcpy(v.data(), a, N * sizeof(int), cudaMemcpyDeviceToHost));
  expect_affine(v, 0, 5, "sync_copy_result");

  // 4. cudaMemcpyAsync from PAGEABLE memory: once the call returns the source may be reused; the
  // device must get the values of the time of the call, even with long work queued before it.
  cudaStream_t nb;
  CK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
  std::vector<int> pageable(N);
  for (int i = 0; i < N; i++) pageable[i] = 11 * i + 1;
  spin(nb, 100.0);
  CK(cudaMemcpyAsync(a, pageable.data(), N * sizeof(int), cudaMemcpyHostToDevice, nb));
  for (int i = 0; i < N; i++) pageable[i] = -1;  // reuse the source at once
  CK(cudaStreamSynchronize(nb));
  CK(cudaMemcpy(v.data(), a, N * sizeof(int), cudaMemcpyDeviceToHost));
  expect_affine(v, 11, 1, "pageable_h2d_async_snapshots_source");
  g_digest.add_vec(v);

  // 5. cudaMemcpyAsync D2H to PAGEABLE memory returns once the data is there, after the work
  // queued before it.
  spin(nb, 80.0);
  iota<<<blocks_for(N), 256, 0, nb>>>(b, N, 13, 2);
  std::vector<int> dst(N, 0);
  CK(cudaMemcpyAsync(dst.data(), b, N * sizeof(int), cudaMemcpyDeviceToHost, nb));
  expect_affine(dst, 13, 2, "pageable_d2h_async_complete_on_return");
  g_digest.add_vec(dst);

  // 6. Pinned async copies ordered with kernels on one stream (truly async).
  int *pin;
  CK(cudaMallocHost(&pin, N * sizeof(int)));
  for (int i = 0; i < N; i++) pin[i] = i;
  CK(cudaMemcpyAsync(a, pin, N * sizeof(int), cudaMemcpyHostToDevice, nb));
  affine<<<blocks_for(N), 256, 0, nb>>>(a, a, N, 4, 4);
  CK(cudaMemsetAsync(b, 0, N * sizeof(int), nb));
  affine<<<blocks_for(N), 256, 0, nb>>>(a, b, N, 1, 1);
  CK(cudaMemcpyAsync(pin, b, N * sizeof(int), cudaMemcpyDeviceToHost, nb));
  CK(cudaStreamSynchronize(nb));
  v.assign(pin, pin + N);
  expect_affine(v, 4, 5, "pinned_async_chain");
  g_digest.add_vec(v);

  // 7. cudaFree of a buffer that queued work still reads and writes: cudaFree waits for the
  // device, so the queued work completes on valid memory and its result (in another buffer)
  // is right.
  int *tmp;
  CK(cudaMalloc(&tmp, N * sizeof(int)));
  spin(nb, 100.0);
  iota<<<blocks_for(N), 256, 0, nb>>>(tmp, N, 6, 6);
  affine<<<blocks_for(N), 256, 0, nb>>>(tmp, b, N, 1, 0);
  CK(cudaFree(tmp));
  CK(cudaStreamSynchronize(nb));
  CK(cudaMemcpy(v.data(), b, N * sizeof(int), cudaMemcpyDeviceToHost));
  expect_affine(v, 6, 6, "cudaFree_after_queued_use");
  g_digest.add_vec(v);

  // 8. cudaFreeHost of a pinned buffer that a queued async copy reads: it waits as well.
  int *pin2;
  CK(cudaMallocHost(&pin2, N * sizeof(int)));
  for (int i = 0; i < N; i++) pin2[i] = 9 * i;
  spin(nb, 100.0);
  CK(cudaMemcpyAsync(a, pin2, N * sizeof(int), cudaMemcpyHostToDevice, nb));
  CK(cudaFreeHost(pin2));
  CK(cudaStreamSynchronize(nb));
  CK(cudaMemcpy(v.data(), a, N * sizeof(int), cudaMemcpyDeviceToHost));
  expect_affine(v, 9, 0, "cudaFreeHost_after_queued_copy");
  g_digest.add_vec(v);

  // 9. Device-to-device sync copy and 2D memset after async work.
  spin(s, 30.0);
  iota<<<blocks_for(N), 256, 0, s>>>(a, N, 1, 100);
  CK(cudaMemcpy(b, a, N * sizeof(int), cudaMemcpyDeviceToDevice));
  CK(cudaMemset2D(a, 64 * sizeof(int), 0, 32 * sizeof(int), N / 64));
  CK(cudaMemcpy(v.data(), b, N * sizeof(int), cudaMemcpyDeviceToHost));
  expect_affine(v, 1, 100, "sync_d2d_copy_after_async_kernel");
  CK(cudaMemcpy(v.data(), a, N * sizeof(int), cudaMemcpyDeviceToHost));
  bool ok = true;
  for (int i = 0; i < N && ok; i++) ok = v[i] == ((i % 64) < 32 ? 0 : i + 100);
  check(ok, "memset2d_after_async_kernel");
  g_digest.add_vec(v);

  CK(cudaFreeHost(pin));
  CK(cudaStreamDestroy(s));
  CK(cudaStreamDestroy(nb));
  return finish();
}
