// cudaStreamWaitEvent across streams whose recording stream has queued (long) work: the waiting
// stream must wait for the record that was current when the wait was issued — not an earlier
// record of the same event — and results depend on that order. The recording stream has the
// LOWEST priority and the waiting one the HIGHEST (the priority-inversion case for a scheduler
// that suspends low-priority queues). Also a DAG over four streams joined with events.
#include "common.h"

static const int N = 1 << 14;
static const int ROUNDS = 16;

// out[i] = in[i] * 2 + round: reads what the recording stream wrote.
__global__ void consume(const int *in, int *out, int n, int round) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * 2 + round;
}

// Spins until the host sets *g (host-mapped memory).
__global__ void gate_wait(const int *g) {
  while (*(volatile const int *)g == 0) {
  }
}

// d[i] += b[i] + c[i]
__global__ void sum_into(const int *b, const int *c, int *d, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] += b[i] + c[i];
}

int main() {
  int lo, hi;  // numerically: greatest = lowest priority
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t producer, waiter;
  CK(cudaStreamCreateWithPriority(&producer, cudaStreamNonBlocking, lo));
  CK(cudaStreamCreateWithPriority(&waiter, cudaStreamNonBlocking, hi));

  // 1. One event re-recorded every round: round r's record follows a spin and the write of
  // buffer r. The waiter waits after each record. Waiting for an earlier record would read
  // buffer r before it is written (zeros) and give a wrong result.
  int *in[ROUNDS], *out[ROUNDS];
  for (int r = 0; r < ROUNDS; r++) {
    CK(cudaMalloc(&in[r], N * sizeof(int)));
    CK(cudaMalloc(&out[r], N * sizeof(int)));
    CK(cudaMemset(in[r], 0, N * sizeof(int)));
    CK(cudaMemset(out[r], 0xff, N * sizeof(int)));
  }
  CK(cudaDeviceSynchronize());
  cudaEvent_t e;
  CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CK(cudaEventRecord(e, producer));  // an early, already complete record
  for (int r = 0; r < ROUNDS; r++) {
    spin(producer, r % 4 == 0 ? 30.0 : 2.0);
    iota<<<blocks_for(N), 256, 0, producer>>>(in[r], N, r + 1, 7 * r);
    CK(cudaEventRecord(e, producer));
    CK(cudaStreamWaitEvent(waiter, e, 0));
    consume<<<blocks_for(N), 256, 0, waiter>>>(in[r], out[r], N, r);
  }
  CK(cudaStreamSynchronize(waiter));
  bool ok = true;
  for (int r = 0; r < ROUNDS; r++) {
    std::vector<int> v = to_host(out[r], N);
    for (int i = 0; i < N && ok; i++) {
      int want = (i * (r + 1) + 7 * r) * 2 + r;
      if (v[i] != want) {
        ok = false;
        check(false, "waiter_sees_current_record", "round %d element %d is %d, expected %d", r, i, v[i], want);
      }
    }
    g_digest.add_vec(v);
  }
  if (ok) check(true, "waiter_sees_current_record");

  // 2. The wait is fixed at the call: recording the event again AFTER the wait does not make the
  // waiter wait for the new record. Observable without timing: the waiter's kernel runs and the
  // host sees it finish while the producer is blocked behind a device-side flag that only the
  // host releases afterwards. (A layer that deferred the wait to the newer record would hang:
  // run.sh's timeout turns that into a failure.)
  int *gate_d;
  volatile int *gate = mapped_alloc<int>(1, &gate_d);
  int *flag_d;
  volatile int *flag = mapped_alloc<int>(1, &flag_d);
  CK(cudaEventRecord(e, producer));
  CK(cudaStreamWaitEvent(waiter, e, 0));
  spin_then_write<<<1, 1, 0, waiter>>>(0, flag_d, 1);
  // Producer: wait on the host-released gate, then record again.
  gate_wait<<<1, 1, 0, producer>>>(gate_d);
  CK(cudaEventRecord(e, producer));
  double t0 = now_s();
  while (*flag == 0 && now_s() - t0 < 20) {
  }
  check(*flag == 1, "wait_binds_to_record_at_call_time", "the waiter did not run while the producer was gated");
  *gate = 1;
  CK(cudaDeviceSynchronize());

  // 3. A DAG over four streams of mixed priority: a -> (b, c) -> d, repeated.
  cudaStream_t st[4];
  for (int k = 0; k < 4; k++) CK(cudaStreamCreateWithPriority(&st[k], cudaStreamNonBlocking, k % 2 ? hi : lo));
  cudaEvent_t ea, eb, ec;
  CK(cudaEventCreateWithFlags(&ea, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&eb, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&ec, cudaEventDisableTiming));
  int *A, *B, *C, *D;
  CK(cudaMalloc(&A, N * sizeof(int)));
  CK(cudaMalloc(&B, N * sizeof(int)));
  CK(cudaMalloc(&C, N * sizeof(int)));
  CK(cudaMalloc(&D, N * sizeof(int)));
  CK(cudaMemset(D, 0, N * sizeof(int)));
  CK(cudaDeviceSynchronize());
  for (int it = 0; it < 50; it++) {
    // d of the previous iteration must be done before a overwrites A? A is read by b and c only,
    // so a waits for eb/ec of the previous iteration (recorded after b and c).
    if (it) {
      CK(cudaStreamWaitEvent(st[0], eb, 0));
      CK(cudaStreamWaitEvent(st[0], ec, 0));
    }
    if (it % 10 == 0) spin(st[0], 5.0);
    iota<<<blocks_for(N), 256, 0, st[0]>>>(A, N, 1, it);  // A = i + it
    CK(cudaEventRecord(ea, st[0]));
    CK(cudaStreamWaitEvent(st[1], ea, 0));
    CK(cudaStreamWaitEvent(st[2], ea, 0));
    affine<<<blocks_for(N), 256, 0, st[1]>>>(A, B, N, 2, 0);  // B = 2A
    affine<<<blocks_for(N), 256, 0, st[2]>>>(A, C, N, 3, 1);  // C = 3A + 1
    CK(cudaEventRecord(eb, st[1]));
    CK(cudaEventRecord(ec, st[2]));
    CK(cudaStreamWaitEvent(st[3], eb, 0));
    CK(cudaStreamWaitEvent(st[3], ec, 0));
    // D += B + C = 5A + 1 = 5i + 5it + 1
    sum_into<<<blocks_for(N), 256, 0, st[3]>>>(B, C, D, N);
    // b and c of the next iteration overwrite B and C: they must wait for d.
    cudaEvent_t ed;
    CK(cudaEventCreateWithFlags(&ed, cudaEventDisableTiming));
    CK(cudaEventRecord(ed, st[3]));
    CK(cudaStreamWaitEvent(st[1], ed, 0));
    CK(cudaStreamWaitEvent(st[2], ed, 0));
    CK(cudaEventDestroy(ed));  // destroying an event with waits pending is legal
  }
  CK(cudaDeviceSynchronize());
  std::vector<int> d = to_host(D, N);
  // sum over it of (5i + 5it + 1) = 50*5i + 5*1225 + 50
  expect_affine(d, 250, 5 * 1225 + 50, "dag_results");
  g_digest.add_vec(d);
  return finish();
}
