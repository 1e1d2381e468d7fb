// Many host threads launching at once, each on its own streams (mixed priorities), released
// together by a barrier: kernels, async copies, events between a thread's streams, a cross-thread
// dependency through a shared event, and concurrent synchronize/query calls.
#include "common.h"

#include <atomic>
#include <barrier>
#include <thread>

static const int THREADS = 32;
static const int N = 1 << 12;
static const int ITERS = 300;

struct Shared {
  std::barrier<> start{THREADS};
  cudaEvent_t ready[THREADS];  // recorded by thread t once its first phase is queued
  std::atomic<int> recorded{0};
};

static void worker(int t, Shared *sh, std::vector<int> *result) {
  int lo, hi;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t s1, s2;
  CK(cudaStreamCreateWithPriority(&s1, cudaStreamNonBlocking, t % 2 ? hi : lo));
  CK(cudaStreamCreateWithPriority(&s2, cudaStreamNonBlocking, t % 3 ? lo : hi));
  int *a, *b;
  CK(cudaMalloc(&a, N * sizeof(int)));
  CK(cudaMalloc(&b, N * sizeof(int)));
  int *pin;
  CK(cudaMallocHost(&pin, N * sizeof(int)));
  cudaEvent_t e;
  CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  sh->start.arrive_and_wait();

  // Phase 1: a = t*i, then ITERS increments interleaved with queries from this thread.
  iota<<<blocks_for(N), 256, 0, s1>>>(a, N, t, 0);
  if (t % 8 == 0) spin(s1, 20.0);
  for (int k = 0; k < ITERS; k++) {
    add_all<<<blocks_for(N), 256, 0, s1>>>(a, N, 1);
    if (k % 50 == 0) {
      cudaError_t q = cudaStreamQuery(s1);
      if (q != cudaSuccess && q != cudaErrorNotReady) CK(q);
    }
  }
  CK(cudaEventRecord(sh->ready[t], s1));
  sh->recorded++;
  // s2 waits for s1 through this thread's own event: b = a * 2.
  CK(cudaEventRecord(e, s1));
  CK(cudaStreamWaitEvent(s2, e, 0));
  affine<<<blocks_for(N), 256, 0, s2>>>(a, b, N, 2, 0);
  // Cross-thread: wait for the neighbour's phase 1 (its event is recorded before the barrier
  // below lets anyone continue), then add the neighbour's index.
  sh->start.arrive_and_wait();
  int nb = (t + 1) % THREADS;
  CK(cudaStreamWaitEvent(s2, sh->ready[nb], 0));
  add_all<<<blocks_for(N), 256, 0, s2>>>(b, N, nb);
  CK(cudaMemcpyAsync(pin, b, N * sizeof(int), cudaMemcpyDeviceToHost, s2));
  if (t % 2) {
    CK(cudaStreamSynchronize(s2));
  } else {
    while (cudaStreamQuery(s2) == cudaErrorNotReady) std::this_thread::yield();
    CK(cudaStreamQuery(s2));
  }
  result->assign(pin, pin + N);
  CK(cudaFreeHost(pin));
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaEventDestroy(e));
  CK(cudaStreamDestroy(s1));
  CK(cudaStreamDestroy(s2));
}

int main() {
  CK(cudaFree(nullptr));  // create the context before the threads race to
  Shared sh;
  for (int t = 0; t < THREADS; t++) CK(cudaEventCreateWithFlags(&sh.ready[t], cudaEventDisableTiming));
  std::vector<std::vector<int>> results(THREADS);
  std::vector<std::thread> ts;
  double t0 = now_s();
  for (int t = 0; t < THREADS; t++) ts.emplace_back(worker, t, &sh, &results[t]);
  for (auto &t : ts) t.join();
  note("%d threads x %d launches in %.0f ms", THREADS, ITERS + 4, (now_s() - t0) * 1e3);
  bool ok = sh.recorded.load() == THREADS;
  for (int t = 0; t < THREADS; t++) {
    int nb = (t + 1) % THREADS;
    for (int i = 0; i < N && ok; i++) {
      int want = 2 * (t * i + ITERS) + nb;
      if (results[t][i] != want) {
        ok = false;
        check(false, "threads_results", "thread %d element %d is %d, expected %d", t, i, results[t][i], want);
      }
    }
    g_digest.add_vec(results[t]);
  }
  if (ok) check(true, "threads_results");
  for (int t = 0; t < THREADS; t++) CK(cudaEventDestroy(sh.ready[t]));
  return finish();
}
