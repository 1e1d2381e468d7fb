// Stream/event synchronization and query semantics with long work queued: a query right after
// the launch says NOT_READY (and never SUCCESS before the work is done), every sync returns only
// after all earlier work of its scope, results are right.
#include "common.h"

static const double kLongMs = 150.0;
static const int N = 1 << 16;

// A query that says SUCCESS must mean the work is done; NOT_READY is required while the long
// kernel cannot have finished yet (asked well inside its duration).
static void query_semantics(const char *name, cudaError_t q, double asked_after_s, const volatile int *done) {
  if (q == cudaSuccess) {
    check(*done == 1, name, "query said SUCCESS but the work has not finished");
  } else if (q == cudaErrorNotReady) {
    check(true, name);
  } else {
    check(false, name, "query returned %s", cudaGetErrorName(q));
  }
  if (asked_after_s < kLongMs / 2000.0)
    check(q == cudaErrorNotReady, "not_ready_while_long_work_pending",
          "query %.3f ms after a %.0f ms kernel's launch said %s", asked_after_s * 1e3, kLongMs,
          cudaGetErrorName(q));
  else
    note("%s asked %.1f ms after launch (too late to require NOT_READY)", name, asked_after_s * 1e3);
}

int main() {
  CK(cudaSetDeviceFlags(cudaDeviceMapHost));
  int *done_d = nullptr;
  volatile int *done = mapped_alloc<int>(4, &done_d);
  int *buf;
  CK(cudaMalloc(&buf, N * sizeof(int)));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // An idle stream and a never-recorded event are complete.
  check(cudaStreamQuery(s) == cudaSuccess, "idle_stream_query_success");
  cudaEvent_t e0, e1, ev;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  check(cudaEventQuery(ev) == cudaSuccess, "unrecorded_event_query_success");

  // 1. cudaStreamQuery / cudaStreamSynchronize.
  double t0 = now_s();
  CK(cudaEventRecord(e0, s));
  spin(s, kLongMs, done_d + 0, 1);
  iota<<<blocks_for(N), 256, 0, s>>>(buf, N, 3, 1);
  affine<<<blocks_for(N), 256, 0, s>>>(buf, buf, N, 2, 5);  // buf = 6i + 7
  CK(cudaEventRecord(e1, s));
  cudaError_t q = cudaStreamQuery(s);
  query_semantics("stream_query_after_long_launch", q, now_s() - t0, done + 0);
  // 2. cudaEventQuery on the event recorded behind the long work.
  q = cudaEventQuery(e1);
  query_semantics("event_query_after_long_launch", q, now_s() - t0, done + 0);
  CK(cudaStreamSynchronize(s));
  double waited = now_s() - t0;
  check(done[0] == 1, "stream_sync_waits_for_long_kernel");
  check(cudaStreamQuery(s) == cudaSuccess, "stream_query_success_after_sync");
  check(cudaEventQuery(e1) == cudaSuccess, "event_query_success_after_sync");
  check(waited >= kLongMs * 0.9e-3, "stream_sync_took_the_kernel_time", "sync returned after %.1f ms", waited * 1e3);
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  check(ms >= kLongMs * 0.9, "event_elapsed_covers_long_kernel", "elapsed %.2f ms", ms);
  std::vector<int> v = to_host(buf, N);
  expect_affine(v, 6, 7, "stream_results");
  g_digest.add_vec(v);

  // 3. cudaEventSynchronize: returns after the recorded work, not before, and not only after
  // work queued later behind it.
  done[1] = 0;
  done[2] = 0;
  spin(s, kLongMs / 2, done_d + 1, 1);
  add_all<<<blocks_for(N), 256, 0, s>>>(buf, N, 100);  // 6i + 107
  CK(cudaEventRecord(ev, s));
  spin(s, kLongMs, done_d + 2, 1);
  add_all<<<blocks_for(N), 256, 0, s>>>(buf, N, 1000);  // 6i + 1107
  CK(cudaEventSynchronize(ev));
  check(done[1] == 1, "event_sync_waits_for_recorded_work");
  bool later_done = done[2] == 1;
  if (later_done) note("event sync returned after the later kernel as well (allowed, but slow)");
  CK(cudaStreamSynchronize(s));
  v = to_host(buf, N);
  expect_affine(v, 6, 1107, "event_sync_results");
  g_digest.add_vec(v);

  // 4. cudaDeviceSynchronize covers several streams, blocking and non-blocking.
  const int K = 4;
  cudaStream_t ss[K];
  int *bufs[K];
  for (int k = 0; k < K; k++) {
    CK(cudaStreamCreateWithFlags(&ss[k], k % 2 ? cudaStreamNonBlocking : cudaStreamDefault));
    CK(cudaMalloc(&bufs[k], N * sizeof(int)));
    done[4 + k] = 0;
  }
  for (int k = 0; k < K; k++) {
    spin(ss[k], kLongMs / 3 * (k + 1), done_d + 4 + k, 1);
    iota<<<blocks_for(N), 256, 0, ss[k]>>>(bufs[k], N, k + 1, k);
  }
  CK(cudaDeviceSynchronize());
  bool all = true;
  for (int k = 0; k < K; k++) all = all && done[4 + k] == 1;
  check(all, "device_sync_waits_for_all_streams");
  for (int k = 0; k < K; k++) {
    CK(cudaStreamQuery(ss[k]));
    v = to_host(bufs[k], N);
    char name[64];
    snprintf(name, sizeof name, "device_sync_results_%d", k);
    expect_affine(v, k + 1, k, name);
    g_digest.add_vec(v);
  }

  // 5. A blocking-sync event (the waiting thread sleeps) behaves the same.
  cudaEvent_t eb;
  CK(cudaEventCreateWithFlags(&eb, cudaEventBlockingSync | cudaEventDisableTiming));
  done[3] = 0;
  spin(s, kLongMs / 2, done_d + 3, 1);
  CK(cudaEventRecord(eb, s));
  check(cudaEventQuery(eb) != cudaSuccess || done[3] == 1, "blocking_event_query_consistent");
  CK(cudaEventSynchronize(eb));
  check(done[3] == 1, "blocking_event_sync_waits");

  // 6. Many short commands then one query loop: the stream eventually reports SUCCESS on its own
  // (a buffering layer must not keep work pending forever when the app only polls).
  for (int i = 0; i < 200; i++) add_all<<<blocks_for(N), 256, 0, s>>>(buf, N, 1);
  double tq = now_s();
  while (cudaStreamQuery(s) == cudaErrorNotReady) {
    if (now_s() - tq > 20) break;
  }
  check(cudaStreamQuery(s) == cudaSuccess, "polling_query_reaches_success");
  v = to_host(buf, N);
  expect_affine(v, 6, 1307, "polled_results");
  g_digest.add_vec(v);

  for (int k = 0; k < K; k++) {
    CK(cudaStreamDestroy(ss[k]));
    CK(cudaFree(bufs[k]));
  }
  CK(cudaStreamDestroy(s));
  return finish();
}
