// Built WITH --default-stream per-thread: stream 0 (and cudaStreamPerThread) is a separate,
// ordinary stream for each host thread, with no implicit synchronization against other streams;
// cudaStreamLegacy still reaches the legacy stream and its barrier. Several threads chain work
// on their per-thread default stream at once. Under xpreempt each thread's per-thread stream is a
// queue of its own, gated and observed like any other (its launches wait in their call while it
// is suspended): what the program sees of it must not change.
#include "common.h"

#include <thread>

static const int N = 1 << 15;
static const int THREADS = 8;
static const int STEPS = 200;

static void worker(int t, std::vector<int> *result) {
  int *buf;
  CK(cudaMalloc(&buf, N * sizeof(int)));
  // Everything on stream 0 (= this thread's default stream).
  iota<<<blocks_for(N), 256>>>(buf, N, t + 1, 0);
  if (t % 3 == 0) spin(0, 20.0);
  for (int i = 0; i < STEPS; i++) add_all<<<blocks_for(N), 256>>>(buf, N, 1);
  CK(cudaStreamSynchronize(0));
  // cudaStreamPerThread names the same stream.
  affine<<<blocks_for(N), 256, 0, cudaStreamPerThread>>>(buf, buf, N, 2, t);
  std::vector<int> v(N);
  CK(cudaMemcpyAsync(v.data(), buf, N * sizeof(int), cudaMemcpyDeviceToHost, cudaStreamPerThread));
  CK(cudaStreamSynchronize(cudaStreamPerThread));
  CK(cudaFree(buf));
  *result = v;
}

// What a program sees of its per-thread stream while xpreempt gates it (random suspensions
// included): a query says not ready while its kernel runs and ready once it is done, a flag the
// kernel writes is there when the synchronize returns, and an event recorded behind the work
// makes another stream wait for all of it. A launch held back and made later would break one of
// these; a launch that waits in its call breaks none.
static void visible(int t, bool *ok) {
  *ok = true;
  int *flag_d;
  volatile int *flag = mapped_alloc<int>(1, &flag_d);
  *flag = 0;
  spin(0, 20.0, flag_d, t + 1);
  bool busy = cudaStreamQuery(0) == cudaErrorNotReady;
  CK(cudaStreamSynchronize(0));
  *ok &= *flag == t + 1 && cudaStreamQuery(0) == cudaSuccess;
  // Queried while a 20 ms kernel runs: only a queue that launched the kernel late (and said
  // ready for the stream meanwhile) would answer ready.
  *ok &= busy;
  int *buf;
  CK(cudaMalloc(&buf, N * sizeof(int)));
  cudaStream_t other;
  CK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  iota<<<blocks_for(N), 256>>>(buf, N, 1, t);
  spin(0, 5.0);
  for (int i = 0; i < 50; i++) add_all<<<blocks_for(N), 256>>>(buf, N, 1);
  CK(cudaEventRecord(ev, cudaStreamPerThread));
  CK(cudaStreamWaitEvent(other, ev, 0));
  affine<<<blocks_for(N), 256, 0, other>>>(buf, buf, N, 3, 0);
  std::vector<int> v(N);
  CK(cudaMemcpyAsync(v.data(), buf, N * sizeof(int), cudaMemcpyDeviceToHost, other));
  CK(cudaStreamSynchronize(other));
  for (int i = 0; i < N && *ok; i++) *ok &= v[i] == 3 * (i + t + 50);
  CK(cudaEventDestroy(ev));
  CK(cudaStreamDestroy(other));
  CK(cudaFree(buf));
  CK(cudaFreeHost((void *)flag));
}

int main() {
  // The per-thread stream is not the legacy stream.
  check(cudaStreamPerThread != cudaStreamLegacy, "per_thread_handle_distinct");

  std::vector<std::vector<int>> results(THREADS);
  std::vector<std::thread> ts;
  for (int t = 0; t < THREADS; t++) ts.emplace_back(worker, t, &results[t]);
  for (auto &t : ts) t.join();
  {
    bool seen[THREADS];
    std::vector<std::thread> vs;
    for (int t = 0; t < THREADS; t++) vs.emplace_back(visible, t, &seen[t]);
    for (auto &t : vs) t.join();
    bool all = true;
    for (int t = 0; t < THREADS; t++) all &= seen[t];
    check(all, "per_thread_stream_state_as_the_program_sees_it");
  }
  for (int t = 0; t < THREADS; t++) {
    char name[64];
    snprintf(name, sizeof name, "per_thread_stream_results_%d", t);
    // ((t+1) i + STEPS) * 2 + t
    expect_affine(results[t], 2 * (t + 1), 2 * STEPS + t, name);
    g_digest.add_vec(results[t]);
  }

  // Per-thread default stream does not wait for a blocking stream (no legacy barrier), but
  // cudaStreamLegacy does.
  int *a, *b;
  CK(cudaMalloc(&a, N * sizeof(int)));
  CK(cudaMalloc(&b, N * sizeof(int)));
  cudaStream_t blocking;
  CK(cudaStreamCreate(&blocking));
  int *done_d;
  volatile int *done = mapped_alloc<int>(1, &done_d);
  spin(blocking, 100.0, done_d, 1);
  iota<<<blocks_for(N), 256, 0, blocking>>>(a, N, 4, 2);
  affine<<<blocks_for(N), 256, 0, cudaStreamLegacy>>>(a, b, N, 1, 1);  // waits for blocking
  CK(cudaStreamSynchronize(cudaStreamLegacy));
  check(*done == 1, "legacy_handle_waits_for_blocking_stream");
  std::vector<int> v(N);
  CK(cudaMemcpyAsync(v.data(), b, N * sizeof(int), cudaMemcpyDeviceToHost, 0));
  CK(cudaStreamSynchronize(0));
  expect_affine(v, 4, 3, "legacy_handle_results");
  g_digest.add_vec(v);

  // Synchronous cudaMemcpy under per-thread compilation is ordered on the per-thread stream.
  add_all<<<blocks_for(N), 256>>>(b, N, 10);
  CK(cudaMemcpy(v.data(), b, N * sizeof(int), cudaMemcpyDeviceToHost));
  expect_affine(v, 4, 13, "sync_memcpy_after_per_thread_kernel");
  g_digest.add_vec(v);
  CK(cudaStreamDestroy(blocking));
  return finish();
}
