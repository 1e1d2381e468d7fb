// Host functions and callbacks in stream order: a host function runs after the work queued
// before it (it sees that work's result in mapped memory) and before the work queued after it
// (which sees what the host function wrote); host functions of one stream run in order; a host
// function on one stream orders another stream through an event; cudaStreamAddCallback too.
#include "common.h"

#include <atomic>
#include <mutex>

static const int STEPS = 64;

struct Log {
  std::mutex mu;
  std::vector<int> entries;
};

struct Step {
  Log *log;
  int index;
  volatile int *mapped;  // written by the kernel before, read here
  volatile int *reply;   // written here, read by the kernel after
};

static void CUDART_CB host_step(void *p) {
  Step *s = static_cast<Step *>(p);
  int seen = s->mapped[0];
  {
    std::lock_guard<std::mutex> g(s->log->mu);
    s->log->entries.push_back(s->index * 100000 + seen);
  }
  s->reply[0] = seen + 1;
}

// mapped[0] = reply[0] * 2 mod P (reads what the host function before it wrote)
static const int P = 99991;
__global__ void double_reply(int *mapped, const int *reply) {
  *(volatile int *)mapped = (*(volatile const int *)reply * 2) % P;
}

static std::atomic<int> g_callbacks{0};
static void CUDART_CB legacy_callback(cudaStream_t, cudaError_t status, void *p) {
  int *expected = static_cast<int *>(p);
  if (status == cudaSuccess && g_callbacks.load() == *expected) g_callbacks++;
}

int main() {
  cudaStream_t s, other;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  int *mapped_d, *reply_d;
  int *mapped = mapped_alloc<int>(1, &mapped_d);
  int *reply = mapped_alloc<int>(1, &reply_d);
  mapped[0] = 1;
  Log log;
  std::vector<Step> steps(STEPS);

  // 1. kernel -> host fn -> kernel -> host fn ...: each sees the previous one's value.
  spin(s, 100.0);
  for (int i = 0; i < STEPS; i++) {
    steps[i] = Step{&log, i, mapped, reply};
    CK(cudaLaunchHostFunc(s, host_step, &steps[i]));
    double_reply<<<1, 1, 0, s>>>(mapped_d, reply_d);
    if (i % 16 == 7) spin(s, 5.0);
  }
  CK(cudaStreamSynchronize(s));
  bool ok = (int)log.entries.size() == STEPS;
  int value = 1;
  for (int i = 0; i < STEPS && ok; i++) {
    ok = log.entries[i] == i * 100000 + value;
    value = ((value + 1) * 2) % P;
    if (!ok) check(false, "host_fn_order", "step %d logged %d", i, log.entries[i]);
  }
  if (ok) check(true, "host_fn_order");
  g_digest.add_vec(log.entries);

  // 2. A host function on stream `other` gates `s` through an event: s's kernel must see the
  // host function's write.
  int *gate_d;
  int *gate = mapped_alloc<int>(1, &gate_d);
  int *seen_d;
  int *seen = mapped_alloc<int>(1, &seen_d);
  struct Gate {
    static void CUDART_CB open(void *p) { *(volatile int *)p = 77; }
  };
  cudaEvent_t e;
  CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  spin(other, 80.0);
  CK(cudaLaunchHostFunc(other, Gate::open, gate));
  CK(cudaEventRecord(e, other));
  CK(cudaStreamWaitEvent(s, e, 0));
  affine<<<1, 1, 0, s>>>(gate_d, seen_d, 1, 1, 0);
  CK(cudaStreamSynchronize(s));
  check(*(volatile int *)seen == 77, "host_fn_orders_other_stream_via_event", "seen %d", *seen);
  g_digest.add_u64(*seen);

  // 3. cudaStreamAddCallback: callbacks run in order, after the work before them.
  static int expected[16];
  spin(s, 30.0);
  for (int i = 0; i < 16; i++) {
    expected[i] = i;
    add_all<<<1, 32, 0, s>>>(mapped_d, 1, 1);
    CK(cudaStreamAddCallback(s, legacy_callback, &expected[i], 0));
  }
  CK(cudaStreamSynchronize(s));
  check(g_callbacks.load() == 16, "stream_callbacks_in_order", "%d in order", g_callbacks.load());
  g_digest.add_u64(g_callbacks.load());
  g_digest.add_u64(*(volatile int *)mapped);
  CK(cudaStreamDestroy(s));
  CK(cudaStreamDestroy(other));
  return finish();
}
