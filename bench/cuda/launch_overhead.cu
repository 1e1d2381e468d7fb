// Added cost of interception, measured the way an application sees it: (1) host time per
// kernel launch in a loop of asynchronous launches of an empty kernel; (2) latency of a
// latency-critical request: 10 short kernels then a stream synchronize. Run natively and under
// `xpreempt run`; prints one JSON object.
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

__global__ void empty_kernel(int) {}

__global__ void spin_kernel(long long ns) {
  long long start = clock64();
  // ~1.7 GHz: ns * 1.7 cycles; exactness does not matter, only that it is short and fixed.
  while (clock64() - start < ns * 17 / 10) {
  }
}

static double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

static double pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, (size_t)(p * v.size()))];
}

int main(int argc, char **argv) {
  int launches = argc > 1 ? atoi(argv[1]) : 20000;
  int requests = argc > 2 ? atoi(argv[2]) : 3000;
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  empty_kernel<<<1, 32, 0, s>>>(0);
  cudaStreamSynchronize(s);

  // (1) per-launch host cost, in batches of 256 so the queue never fills the hardware ring.
  std::vector<double> per_launch;
  for (int done = 0; done < launches; done += 256) {
    double t = now_us();
    for (int i = 0; i < 256; i++) empty_kernel<<<1, 32, 0, s>>>(i);
    per_launch.push_back((now_us() - t) / 256);
    cudaStreamSynchronize(s);
  }

  // (2) LC requests: 10 kernels of ~5 us, then synchronize.
  std::vector<double> lat, at;
  for (int r = 0; r < requests + 100; r++) {
    double t = now_us();
    for (int k = 0; k < 10; k++) spin_kernel<<<4, 128, 0, s>>>(5000);
    cudaStreamSynchronize(s);
    if (r >= 100) lat.push_back(now_us() - t), at.push_back(t);
  }
  // XP_LAT_DUMP=FILE: every request's start (µs since the first) and latency, to see whether
  // slow requests cluster in time.
  if (const char *path = getenv("XP_LAT_DUMP")) {
    if (FILE *f = fopen(path, "w")) {
      for (size_t i = 0; i < lat.size(); i++) fprintf(f, "%.1f %.2f\n", at[i] - at[0], lat[i]);
      fclose(f);
    }
  }
  cudaError_t e = cudaGetLastError();
  printf("{\"launch_us_p50\": %.3f, \"launch_us_mean\": %.3f, \"request_us_p50\": %.2f, "
         "\"request_us_p99\": %.2f, \"request_us_p999\": %.2f, \"requests\": %zu, \"error\": \"%s\"}\n",
         pct(per_launch, 0.5),
         [&] { double s = 0; for (double x : per_launch) s += x; return s / per_launch.size(); }(),
         pct(lat, 0.5), pct(lat, 0.99), pct(lat, 0.999), lat.size(), cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
