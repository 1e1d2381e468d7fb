// Shared by green_probe.cu and green_timing.cu: the kernels, and the green
// context set-up. Built alone with -DGREEN_KERNELS_ONLY into the cubin that the programs load with
// cuModuleLoadData / cuLibraryLoadData (path in $GREEN_CUBIN); bench/run-green.sh does the builds.

#include <cuda.h>
#include <cuda_runtime.h>

#include <stdint.h>

extern "C" __device__ __forceinline__ unsigned long long gtime_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
extern "C" __device__ __forceinline__ int smid() {
  int id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}
// Each block writes the SM it ran on: shows where a launch went, and that it ran.
extern "C" __global__ void k_mark(int *sm_of_block, int n) {
  if (threadIdx.x == 0 && blockIdx.x < n) sm_of_block[blockIdx.x] = smid();
}
extern "C" __global__ void k_add(int *p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += 1;
}
// Every block spins ns nanoseconds of wall time; thread 0 of each block counts it done.
extern "C" __global__ void __launch_bounds__(1024, 2) k_spin(unsigned long long ns, unsigned long long *done) {
  unsigned long long start = gtime_ns();
  while (gtime_ns() - start < ns) {
  }
  __syncthreads();
  if (threadIdx.x == 0 && done) atomicAdd(done, 1ULL);
}
extern "C" __global__ void k_set_after(int *flag, int v, unsigned long long ns) {
  unsigned long long start = gtime_ns();
  while (gtime_ns() - start < ns) {
  }
  *flag = v;
}
extern "C" __global__ void k_copy(int *dst, const int *src) { *dst = *src; }

#ifndef GREEN_KERNELS_ONLY
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <sys/mman.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

static inline const char *cu_name(CUresult r) {
  const char *s = nullptr;
  cuGetErrorName(r, &s);
  return s ? s : "?";
}
static inline double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
static inline int env_int(const char *k, int d) {
  const char *v = getenv(k);
  return v ? atoi(v) : d;
}

// A green context holding all SMs but `keep_free` (rounded up by the driver), plus one made of
// the split-off group: `rest` for BE, `part` for LC.
struct Green {
  CUresult rc = CUDA_SUCCESS;
  const char *step = "";
  CUdevResource all{}, part{}, rest{};
  CUgreenCtx rest_g = nullptr, part_g = nullptr;
  CUcontext rest_ctx = nullptr, part_ctx = nullptr;
  CUstream rest_s = nullptr, part_s = nullptr;
  double create_us = 0;
};
#define GSTEP(call)        \
  do {                     \
    g.step = #call;        \
    g.rc = (call);         \
    if (g.rc) return g;    \
  } while (0)
static inline Green make_green(CUdevice dev, unsigned keep_free, int prio) {
  Green g;
  GSTEP(cuDeviceGetDevResource(dev, &g.all, CU_DEV_RESOURCE_TYPE_SM));
  unsigned nb = 1;
  GSTEP(cuDevSmResourceSplitByCount(&g.part, &nb, &g.all, &g.rest, 0, keep_free));
  CUdevResourceDesc drest, dpart;
  GSTEP(cuDevResourceGenerateDesc(&drest, &g.rest, 1));
  GSTEP(cuDevResourceGenerateDesc(&dpart, &g.part, 1));
  double t = now_us();
  GSTEP(cuGreenCtxCreate(&g.rest_g, drest, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  g.create_us = now_us() - t;
  GSTEP(cuGreenCtxCreate(&g.part_g, dpart, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  GSTEP(cuCtxFromGreenCtx(&g.rest_ctx, g.rest_g));
  GSTEP(cuCtxFromGreenCtx(&g.part_ctx, g.part_g));
  GSTEP(cuGreenCtxStreamCreate(&g.rest_s, g.rest_g, CU_STREAM_NON_BLOCKING, prio));
  GSTEP(cuGreenCtxStreamCreate(&g.part_s, g.part_g, CU_STREAM_NON_BLOCKING, prio));
  g.step = "";
  return g;
}

static inline std::vector<char> read_file(const char *path) {
  std::vector<char> v;
  FILE *f = path ? fopen(path, "rb") : nullptr;
  if (!f) return v;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) v.insert(v.end(), buf, buf + n);
  fclose(f);
  return v;
}

// A module of the kernels loaded into `ctx` (made current for the load, then restored).
static inline CUresult load_in(CUcontext ctx, const std::vector<char> &image, CUmodule *m) {
  CUresult r = cuCtxPushCurrent(ctx);
  if (r) return r;
  r = cuModuleLoadData(m, image.data());
  CUcontext dummy;
  cuCtxPopCurrent(&dummy);
  return r;
}

struct Common {
  CUdevice dev;
  CUcontext prim;
  int nsm;
  std::vector<char> image;
};
static inline Common init_common() {
  Common c{};
  cuInit(0);
  cuDeviceGet(&c.dev, 0);
  cudaSetDevice(0);
  cudaFree(0);  // the runtime makes the primary context current
  cuCtxGetCurrent(&c.prim);
  cuDeviceGetAttribute(&c.nsm, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, c.dev);
  c.image = read_file(getenv("GREEN_CUBIN"));
  return c;
}


static inline CUfunction fn_of(CUmodule m, const char *name) {
  CUfunction f = nullptr;
  if (m) cuModuleGetFunction(&f, m, name);
  return f;
}
#endif  // GREEN_KERNELS_ONLY
