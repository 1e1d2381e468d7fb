// Stream capture and graphs: work queued on a stream BEFORE capture begins executes (once) and is
// not part of the graph; captured work does not execute until the graph is launched; a graph
// captured across streams (fork/join with events) in global and thread-local modes; graphs
// instantiated and relaunched many times, behind long work and on different streams; capture
// from several threads at once (thread-local mode); an explicitly built graph; cudaGraphUpload; a
// graph replayed on the legacy default stream between kernels of a blocking stream.
#include "common.h"

#include <thread>

static const int N = 1 << 14;

// Counts executions of itself: a graph relaunched k times adds k * delta.
__global__ void bump(int *counter, int delta) { atomicAdd(counter, delta); }

static cudaGraphExec_t capture_chain(cudaStream_t s, cudaStreamCaptureMode mode, int *buf, int *counter) {
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(s, mode));
  cudaStreamCaptureStatus st;
  CK(cudaStreamIsCapturing(s, &st));
  check(st == cudaStreamCaptureStatusActive, "is_capturing_active");
  add_all<<<blocks_for(N), 256, 0, s>>>(buf, N, 2);
  CK(cudaMemsetAsync(counter + 1, 0, sizeof(int), s));
  bump<<<1, 1, 0, s>>>(counter, 1);
  affine<<<blocks_for(N), 256, 0, s>>>(buf, buf, N, 1, 1);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaStreamIsCapturing(s, &st));
  check(st == cudaStreamCaptureStatusNone, "is_capturing_none_after_end");
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphDestroy(g));
  return ge;
}

static void thread_capture(int t, std::vector<int> *result) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int *buf, *counter;
  CK(cudaMalloc(&buf, N * sizeof(int)));
  CK(cudaMalloc(&counter, 2 * sizeof(int)));
  CK(cudaMemsetAsync(counter, 0, 2 * sizeof(int), s));
  iota<<<blocks_for(N), 256, 0, s>>>(buf, N, t, 0);
  cudaGraphExec_t ge = capture_chain(s, cudaStreamCaptureModeThreadLocal, buf, counter);
  for (int k = 0; k < 50 + t; k++) CK(cudaGraphLaunch(ge, s));
  std::vector<int> v(N);
  CK(cudaMemcpyAsync(v.data(), buf, N * sizeof(int), cudaMemcpyDeviceToHost, s));
  int c = 0;
  CK(cudaMemcpyAsync(&c, counter, sizeof(int), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  v.push_back(c);
  *result = v;
  CK(cudaGraphExecDestroy(ge));
  CK(cudaStreamDestroy(s));
}

int main() {
  cudaStream_t s, s2, s3;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s3, cudaStreamNonBlocking));
  int *buf, *counter;
  CK(cudaMalloc(&buf, N * sizeof(int)));
  CK(cudaMalloc(&counter, 2 * sizeof(int)));
  CK(cudaMemset(counter, 0, 2 * sizeof(int)));
  CK(cudaDeviceSynchronize());

  // 1. Work queued before the capture (behind a long spin) runs exactly once, outside the graph.
  spin(s, 100.0);
  iota<<<blocks_for(N), 256, 0, s>>>(buf, N, 1, 0);
  bump<<<1, 1, 0, s>>>(counter, 1000);
  cudaGraphExec_t ge = capture_chain(s, cudaStreamCaptureModeGlobal, buf, counter);
  CK(cudaStreamSynchronize(s));
  int c = 0;
  CK(cudaMemcpy(&c, counter, sizeof(int), cudaMemcpyDeviceToHost));
  check(c == 1000, "pre_capture_work_ran_once_captured_work_not_yet", "counter %d", c);
  std::vector<int> v = to_host(buf, N);
  expect_affine(v, 1, 0, "captured_work_not_executed_before_launch");

  // 2. Relaunch the graph many times, first behind long work.
  spin(s, 100.0);
  const int R = 500;
  for (int k = 0; k < R; k++) CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(&c, counter, sizeof(int), cudaMemcpyDeviceToHost));
  check(c == 1000 + R, "graph_relaunched_count", "counter %d", c);
  v = to_host(buf, N);
  expect_affine(v, 1, 3 * R, "graph_relaunched_results");
  g_digest.add_vec(v);

  // 3. The same exec launched on another stream, ordered with an event.
  cudaEvent_t e;
  CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  spin(s, 50.0);
  add_all<<<blocks_for(N), 256, 0, s>>>(buf, N, 10);
  CK(cudaEventRecord(e, s));
  CK(cudaStreamWaitEvent(s2, e, 0));
  CK(cudaGraphUpload(ge, s2));
  for (int k = 0; k < 10; k++) CK(cudaGraphLaunch(ge, s2));
  CK(cudaStreamSynchronize(s2));
  v = to_host(buf, N);
  expect_affine(v, 1, 3 * R + 10 + 30, "graph_on_other_stream_after_event");
  g_digest.add_vec(v);

  // 4. Multi-stream capture (fork/join through events) in global mode: s forks to s2 and s3.
  {
    int *x, *y, *z;
    CK(cudaMalloc(&x, N * sizeof(int)));
    CK(cudaMalloc(&y, N * sizeof(int)));
    CK(cudaMalloc(&z, N * sizeof(int)));
    cudaEvent_t fork, j2, j3;
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&j2, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&j3, cudaEventDisableTiming));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    iota<<<blocks_for(N), 256, 0, s>>>(x, N, 2, 0);
    CK(cudaEventRecord(fork, s));
    CK(cudaStreamWaitEvent(s2, fork, 0));
    CK(cudaStreamWaitEvent(s3, fork, 0));
    affine<<<blocks_for(N), 256, 0, s2>>>(x, y, N, 3, 0);  // y = 6i
    affine<<<blocks_for(N), 256, 0, s3>>>(x, z, N, 5, 0);  // z = 10i
    CK(cudaEventRecord(j2, s2));
    CK(cudaEventRecord(j3, s3));
    CK(cudaStreamWaitEvent(s, j2, 0));
    CK(cudaStreamWaitEvent(s, j3, 0));
    affine<<<blocks_for(N), 256, 0, s>>>(y, x, N, 1, 0);  // x = y
    CK(cudaStreamEndCapture(s, &g));
    size_t nodes = 0;
    CK(cudaGraphGetNodes(g, nullptr, &nodes));
    check(nodes == 4, "fork_join_graph_has_4_nodes", "%zu nodes", nodes);
    cudaGraphExec_t fj;
    CK(cudaGraphInstantiate(&fj, g, 0));
    spin(s, 50.0);
    for (int k = 0; k < 20; k++) CK(cudaGraphLaunch(fj, s));
    CK(cudaStreamSynchronize(s));
    v = to_host(x, N);
    expect_affine(v, 6, 0, "fork_join_graph_x");
    g_digest.add_vec(v);
    v = to_host(z, N);
    expect_affine(v, 10, 0, "fork_join_graph_z");
    g_digest.add_vec(v);
    CK(cudaGraphExecDestroy(fj));
    CK(cudaGraphDestroy(g));
  }

  // 5. Relaxed-mode capture and an explicitly built graph (kernel node + memset node).
  {
    int *w;
    CK(cudaMalloc(&w, N * sizeof(int)));
    cudaGraph_t g;
    CK(cudaGraphCreate(&g, 0));
    cudaMemsetParams mp = {};
    mp.dst = w;
    mp.value = 0;
    mp.elementSize = sizeof(int);
    mp.width = N;
    mp.height = 1;
    cudaGraphNode_t ms, kn;
    CK(cudaGraphAddMemsetNode(&ms, g, nullptr, 0, &mp));
    int n = N, mul = 1, add = 7;
    void *kargs[] = {&w, &w, &n, &mul, &add};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)affine;
    kp.gridDim = dim3(blocks_for(N));
    kp.blockDim = dim3(256);
    kp.kernelParams = kargs;
    CK(cudaGraphAddKernelNode(&kn, g, &ms, 1, &kp));
    cudaGraphExec_t ex;
    CK(cudaGraphInstantiate(&ex, g, 0));
    spin(s3, 50.0);
    CK(cudaGraphLaunch(ex, s3));
    CK(cudaStreamSynchronize(s3));
    v = to_host(w, N);
    expect_affine(v, 0, 7, "explicit_graph");
    g_digest.add_vec(v);

    CK(cudaStreamBeginCapture(s3, cudaStreamCaptureModeRelaxed));
    add_all<<<blocks_for(N), 256, 0, s3>>>(w, N, 5);
    cudaGraph_t g2;
    CK(cudaStreamEndCapture(s3, &g2));
    cudaGraphExec_t ex2;
    CK(cudaGraphInstantiate(&ex2, g2, 0));
    for (int k = 0; k < 100; k++) CK(cudaGraphLaunch(ex2, s3));
    CK(cudaStreamSynchronize(s3));
    v = to_host(w, N);
    expect_affine(v, 0, 507, "relaxed_capture_graph");
    g_digest.add_vec(v);
  }

  // 6. Several threads capture and replay graphs at once (thread-local mode).
  const int T = 6;
  std::vector<std::vector<int>> results(T);
  std::vector<std::thread> ts;
  for (int t = 0; t < T; t++) ts.emplace_back(thread_capture, t, &results[t]);
  for (auto &t : ts) t.join();
  bool ok = true;
  for (int t = 0; t < T; t++) {
    int launches = 50 + t;
    ok = ok && results[t].back() == launches;
    for (int i = 0; i < N && ok; i++) ok = results[t][i] == t * i + 3 * launches;
    g_digest.add_vec(results[t]);
  }
  check(ok, "threaded_thread_local_capture");

  // 7. A graph replayed on the legacy default stream, as PyTorch replays its graphs, alternating
  //    with kernels on a blocking stream: each launch follows the blocking stream's work before it
  //    and the blocking stream's next kernel follows the launch (the legacy stream's implicit
  //    synchronization), so the doubling and the graph's +3 alternate in order.
  {
    cudaStream_t blocking;
    CK(cudaStreamCreate(&blocking));
    int *lb, *lc;
    CK(cudaMalloc(&lb, N * sizeof(int)));
    CK(cudaMalloc(&lc, 2 * sizeof(int)));
    CK(cudaMemset(lc, 0, 2 * sizeof(int)));
    cudaGraphExec_t lg = capture_chain(s, cudaStreamCaptureModeGlobal, lb, lc);
    iota<<<blocks_for(N), 256, 0, blocking>>>(lb, N, 1, 0);
    const int L = 10;
    int add = 0;
    for (int k = 0; k < L; k++) {
      spin(blocking, 0.2);
      affine<<<blocks_for(N), 256, 0, blocking>>>(lb, lb, N, 2, 1);
      CK(cudaGraphLaunch(lg, 0));
      add = 2 * add + 1 + 3;
    }
    add_all<<<blocks_for(N), 256, 0, blocking>>>(lb, N, 5);
    CK(cudaStreamSynchronize(blocking));
    int lcount = 0;
    CK(cudaMemcpy(&lcount, lc, sizeof(int), cudaMemcpyDeviceToHost));
    check(lcount == L, "graph_on_legacy_stream_count", "counter %d", lcount);
    v = to_host(lb, N);
    expect_affine(v, 1 << L, add + 5, "graph_on_legacy_stream_in_order");
    g_digest.add_vec(v);
    CK(cudaGraphExecDestroy(lg));
    CK(cudaStreamDestroy(blocking));
    CK(cudaFree(lb));
    CK(cudaFree(lc));
  }
  CK(cudaGraphExecDestroy(ge));
  return finish();
}
