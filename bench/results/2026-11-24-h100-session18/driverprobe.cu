// Does a 4-byte flag copy on one stream wait for another thread's kernel launch in the same
// context? Thread "be" launches saturating spin kernels on a low-priority stream (at most 8 in
// flight, like a BE queue); thread "stop" copies a pinned word to a device word on a
// highest-priority stream every 20-200 us and times the call, noting whether "be" was inside
// cudaLaunchKernel when the copy began. The third argument picks how the word is set: copy
// (cuMemcpyHtoDAsync), memset (cuMemsetD32Async) or write (cuStreamWriteValue32).
// Build: nvcc -O2 -o driverprobe driverprobe.cu -lcuda
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include <cuda.h>
#include <cstring>

__global__ void spin(unsigned long long ns) {
  unsigned long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 >= ns) break;
  }
}

static double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

static void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) { fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e)); exit(1); }
}

static double pct(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, (size_t)(p * v.size()))];
}

int main(int argc, char** argv) {
  double secs = argc > 1 ? atof(argv[1]) : 3.0;
  const char* tag = argc > 2 ? argv[2] : "run";
  const char* how = argc > 3 ? argv[3] : "copy";
  int lo, hi;
  check(cudaDeviceGetStreamPriorityRange(&lo, &hi), "range");
  cudaStream_t be_s, ctl_s;
  check(cudaStreamCreateWithPriority(&be_s, cudaStreamNonBlocking, lo), "stream");
  check(cudaStreamCreateWithPriority(&ctl_s, cudaStreamNonBlocking, hi), "stream");
  int* flag; int* word;
  check(cudaMalloc(&flag, 4), "malloc");
  check(cudaMallocHost(&word, 4), "host");
  *word = 1;
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  spin<<<1, 1, 0, be_s>>>(1000); check(cudaStreamSynchronize(be_s), "warm");
  cudaMemcpyAsync(flag, word, 4, cudaMemcpyHostToDevice, ctl_s); cudaStreamSynchronize(ctl_s);

  std::atomic<int> in_launch{0}, done{0};
  std::vector<double> launch_us;
  std::thread be([&] {
    std::vector<cudaEvent_t> evs(16);
    for (auto& e : evs) cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    size_t n = 0;
    while (!done.load()) {
      if (n >= 8) cudaEventSynchronize(evs[(n - 8) % 16]);
      in_launch.store(1);
      double t0 = now_us();
      spin<<<sms * 4, 128, 0, be_s>>>(20000);
      double t1 = now_us();
      in_launch.store(0);
      cudaEventRecord(evs[n % 16], be_s);
      launch_us.push_back(t1 - t0);
      n++;
    }
    cudaStreamSynchronize(be_s);
  });
  std::vector<double> busy, free_;
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> gap(20, 200);
  double end = now_us() + secs * 1e6;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  while (now_us() < end) {
    double until = now_us() + gap(rng);
    while (now_us() < until) {}
    int was = in_launch.load();
    double t0 = now_us();
    CUresult r;
    if (!strcmp(how, "memset")) r = cuMemsetD32Async((CUdeviceptr)flag, 1, 1, (CUstream)ctl_s);
    else if (!strcmp(how, "write")) r = cuStreamWriteValue32((CUstream)ctl_s, (CUdeviceptr)flag, 1, 0);
    else r = cuMemcpyHtoDAsync((CUdeviceptr)flag, word, 4, (CUstream)ctl_s);
    if (r != CUDA_SUCCESS) { fprintf(stderr, "set (%s): %d\n", how, (int)r); exit(1); }
    double dt = now_us() - t0;
    (was ? busy : free_).push_back(dt);
  }
  done.store(1);
  be.join();
  cudaStreamSynchronize(ctl_s);
  printf("{\"tag\":\"%s-%s\",\"launch_p50\":%.2f,\"launch_p99\":%.2f,\"launches\":%zu,"
         "\"copy_free_n\":%zu,\"copy_free_p50\":%.2f,\"copy_free_p90\":%.2f,\"copy_free_p99\":%.2f,"
         "\"copy_in_launch_n\":%zu,\"copy_in_launch_p50\":%.2f,\"copy_in_launch_p90\":%.2f,\"copy_in_launch_p99\":%.2f}\n",
         tag, how, pct(launch_us, .5), pct(launch_us, .99), launch_us.size(), free_.size(), pct(free_, .5),
         pct(free_, .9), pct(free_, .99), busy.size(), pct(busy, .5), pct(busy, .9), pct(busy, .99));
  return 0;
}
