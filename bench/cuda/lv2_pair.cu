// What Lv2 buys an unmodified application: a best-effort process whose kernels are guard-built
// (long blocks) beside a latency-critical process doing short requests (bench/run-lv2-pair.sh).
//
//   lv2_pair be SECONDS BLOCK_US [sync|events]
//                                  guarded kernels of 4 waves of BLOCK_US-long blocks for SECONDS,
//                                  at most 4 in flight: a stream synchronize after every 4 (sync,
//                                  the default), or an event recorded behind each kernel and
//                                  waited for 4 kernels later (events); prints one JSON line
//                                  (kernels, blocks/s, the shim's guarded launches and relaunches)
//   lv2_pair lc N PERIOD_MS        N requests (a 132-block, 30 us kernel and a stream synchronize)
//                                  every PERIOD_MS; prints one JSON line (latency percentiles, ms)
//
// The BE kernels are marked with XP_GUARD_MARK and launched with XP_GUARD_NONE, as an application
// built with xpreempt_guard.cuh would: under `xpreempt run --level 2` the shim fills in the guard.
#include "xpreempt_guard.cuh"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#define CK(call)                                                                             \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(2);                                                                               \
    }                                                                                        \
  } while (0)

__device__ __forceinline__ unsigned long long gtimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void spin_ns(unsigned long long ns) {
  unsigned long long t0 = gtimer_ns();
  while (gtimer_ns() - t0 < ns) {
  }
}

XP_GUARD_MARK(be_block)
extern "C" __global__ void be_block(XP_GUARD_PARAMS, unsigned *runs, unsigned long long ns) {
  if (!xp_block_begin(XP_GUARD_ARGS)) return;
  if (threadIdx.x == 0) spin_ns(ns);
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(&runs[xp_block_id()], 1u);
  xp_block_end(XP_GUARD_ARGS);
}

__global__ void lc_request(unsigned long long ns, int *out) {
  if (threadIdx.x == 0) spin_ns(ns);
  if (threadIdx.x == 0 && blockIdx.x == 0) *out += 1;
}

static double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static unsigned long long shim_counter(const char *name) {
  auto f = (unsigned long long (*)())dlsym(RTLD_DEFAULT, name);
  return f ? f() : 0;
}

static int be(double seconds, double block_us, bool events) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int threads = 1024, blocks = sms * 2 * 4;  // 2 resident blocks per SM, 4 waves
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  unsigned *runs;
  CK(cudaMalloc(&runs, sizeof(unsigned) * blocks));
  CK(cudaMemset(runs, 0, sizeof(unsigned) * blocks));
  std::vector<cudaEvent_t> evs(4);
  for (auto &e : evs) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  unsigned long long ns = (unsigned long long)(block_us * 1000);
  double t0 = now_s();
  long kernels = 0;
  while (now_s() - t0 < seconds) {
    cudaEvent_t e = evs[kernels % evs.size()];
    if (events && kernels >= (long)evs.size()) CK(cudaEventSynchronize(e));  // at most 4 in flight
    be_block<<<blocks, threads, 0, s>>>(XP_GUARD_NONE, runs, ns);
    CK(cudaGetLastError());
    if (events) CK(cudaEventRecord(e, s));
    kernels++;
    if (!events && kernels % 4 == 0) CK(cudaStreamSynchronize(s));
  }
  CK(cudaStreamSynchronize(s));
  double secs = now_s() - t0;
  std::vector<unsigned> got(blocks);
  CK(cudaMemcpy(got.data(), runs, sizeof(unsigned) * blocks, cudaMemcpyDeviceToHost));
  bool exact = std::all_of(got.begin(), got.end(), [&](unsigned v) { return v == (unsigned)kernels; });
  printf("{\"role\": \"be\", \"flow\": \"%s\", \"kernels\": %ld, \"blocks\": %d, \"block_us\": %.0f, \"seconds\": %.3f, "
         "\"blocks_per_s\": %.1f, \"exactly_once\": %s, \"guarded\": %llu, \"relaunched\": %llu}\n",
         events ? "events" : "sync", kernels, blocks, block_us, secs, kernels * blocks / secs, exact ? "true" : "false",
         shim_counter("xpreempt_shim_cuda_guarded"), shim_counter("xpreempt_shim_cuda_relaunched"));
  return exact ? 0 : 1;
}

static double pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, (size_t)(p / 100.0 * (double)v.size()));
  return v[i];
}

static int lc(int n, double period_ms) {
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  int *out;
  CK(cudaMalloc(&out, sizeof(int)));
  for (int i = 0; i < 20; i++) {  // warm-up
    lc_request<<<132, 256, 0, s>>>(30000, out);
    CK(cudaStreamSynchronize(s));
  }
  std::vector<double> lat;
  double next = now_s();
  for (int i = 0; i < n; i++) {
    next += period_ms / 1000.0;
    double t = now_s();
    lc_request<<<132, 256, 0, s>>>(30000, out);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(s));
    lat.push_back((now_s() - t) * 1000.0);
    double wait = next - now_s();
    if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  }
  double sum = 0;
  for (double x : lat) sum += x;
  printf("{\"role\": \"lc\", \"requests\": %d, \"period_ms\": %.1f, \"p50_ms\": %.4f, \"p90_ms\": %.4f, "
         "\"p99_ms\": %.4f, \"max_ms\": %.4f, \"mean_ms\": %.4f}\n",
         n, period_ms, pct(lat, 50), pct(lat, 90), pct(lat, 99), pct(lat, 100), sum / (double)n);
  return 0;
}

int main(int argc, char **argv) {
  if ((argc == 4 || argc == 5) && !strcmp(argv[1], "be"))
    return be(atof(argv[2]), atof(argv[3]), argc == 5 && !strcmp(argv[4], "events"));
  if (argc == 4 && !strcmp(argv[1], "lc")) return lc(atoi(argv[2]), atof(argv[3]));
  fprintf(stderr, "usage: lv2_pair be SECONDS BLOCK_US [sync|events] | lv2_pair lc N PERIOD_MS\n");
  return 2;
}
