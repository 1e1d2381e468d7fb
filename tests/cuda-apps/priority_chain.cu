// Streams of one process at different priorities that depend on each other, the cases where a
// scheduler that stops lower queues for higher ones could make a stream wait on a stream stopped
// for it: (1) a ping-pong chain HIGH -> LOW -> HIGH through events, each hop behind long work on
// the other stream; (2) the legacy default stream ordered after a LOW-priority blocking stream
// with long work queued, then waited on by a HIGH-priority non-blocking stream; (3) three
// priorities in a ring, each stage reading the previous one's buffer. Results depend on every
// edge being kept; a circular wait shows up as run.sh's timeout.
#include "common.h"

static const int N = 1 << 14;
static const int ROUNDS = 12;

int main() {
  int lo, hi;  // numerically: greatest = lowest priority
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  int mid = (lo + hi) / 2;
  cudaStream_t low, high, middle, blocking_low;
  CK(cudaStreamCreateWithPriority(&low, cudaStreamNonBlocking, lo));
  CK(cudaStreamCreateWithPriority(&high, cudaStreamNonBlocking, hi));
  CK(cudaStreamCreateWithPriority(&middle, cudaStreamNonBlocking, mid));
  CK(cudaStreamCreateWithPriority(&blocking_low, cudaStreamDefault, lo));
  int *a, *b, *c;
  CK(cudaMalloc(&a, N * sizeof(int)));
  CK(cudaMalloc(&b, N * sizeof(int)));
  CK(cudaMalloc(&c, N * sizeof(int)));
  cudaEvent_t to_low, to_high, ev_c;
  CK(cudaEventCreateWithFlags(&to_low, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&to_high, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&ev_c, cudaEventDisableTiming));

  // 1. Ping-pong: high writes a, low turns it into b (after long work of its own), high reads b
  // back into a. a ends as ((i*2 + 1)*2 + 1)... applied ROUNDS times: track it on the host.
  iota<<<blocks_for(N), 256, 0, high>>>(a, N, 1, 0);  // a = i
  for (int r = 0; r < ROUNDS; r++) {
    CK(cudaEventRecord(to_low, high));
    if (r % 3 == 0) spin(low, 20.0);
    CK(cudaStreamWaitEvent(low, to_low, 0));
    affine<<<blocks_for(N), 256, 0, low>>>(a, b, N, 2, 1);  // b = 2a + 1
    CK(cudaEventRecord(to_high, low));
    if (r % 4 == 1) spin(high, 5.0);
    CK(cudaStreamWaitEvent(high, to_high, 0));
    affine<<<blocks_for(N), 256, 0, high>>>(b, a, N, 1, -1);  // a = b - 1 = 2a
  }
  CK(cudaStreamSynchronize(high));
  // a = i * 2^ROUNDS
  expect_affine(to_host(a, N), 1 << ROUNDS, 0, "ping_pong_across_priorities");
  g_digest.add_vec(to_host(a, N));

  // 2. The legacy stream follows the blocking low stream's queued work; the high stream waits
  // on the legacy stream.
  spin(blocking_low, 30.0);
  iota<<<blocks_for(N), 256, 0, blocking_low>>>(b, N, 3, 4);       // b = 3i + 4
  affine<<<blocks_for(N), 256, 0, 0>>>(b, c, N, 1, 1);               // legacy: c = b + 1
  CK(cudaEventRecord(ev_c, 0));
  CK(cudaStreamWaitEvent(high, ev_c, 0));
  affine<<<blocks_for(N), 256, 0, high>>>(c, a, N, 2, 0);            // a = 2c = 6i + 10
  CK(cudaStreamSynchronize(high));
  expect_affine(to_host(a, N), 6, 10, "legacy_edge_from_a_low_blocking_stream");
  g_digest.add_vec(to_host(a, N));

  // 3. A ring over three priorities: low -> middle -> high -> low, ROUNDS times.
  cudaStream_t ring[3] = {low, middle, high};
  int *buf[3] = {a, b, c};
  cudaEvent_t done[3];
  for (int k = 0; k < 3; k++) CK(cudaEventCreateWithFlags(&done[k], cudaEventDisableTiming));
  iota<<<blocks_for(N), 256, 0, low>>>(a, N, 1, 0);  // a = i
  CK(cudaEventRecord(done[0], low));
  int add = 0;
  for (int r = 0; r < ROUNDS; r++) {
    int from = r % 3, to = (r + 1) % 3;
    CK(cudaStreamWaitEvent(ring[to], done[from], 0));
    if (r % 5 == 0) spin(ring[to], 10.0);
    affine<<<blocks_for(N), 256, 0, ring[to]>>>(buf[from], buf[to], N, 1, r + 1);
    add += r + 1;
    CK(cudaEventRecord(done[to], ring[to]));
  }
  CK(cudaDeviceSynchronize());
  expect_affine(to_host(buf[ROUNDS % 3], N), 1, add, "ring_over_three_priorities");
  g_digest.add_vec(to_host(buf[ROUNDS % 3], N));
  return finish();
}
