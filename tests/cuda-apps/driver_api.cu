// Driver API with work queued: cuModuleUnload and cuLibraryUnload of code that queued launches
// use (PTX and CUBIN from NVRTC), cuCtxDestroy of a context with pending work (results land in
// host memory that outlives the context), and stream memory operations: cuStreamWaitValue32
// released by cuStreamWriteValue32 from another stream, and by the host.
#include "common.h"

#include <cuda.h>
#include <nvrtc.h>
#include <sys/mman.h>

#define CU(call)                                                                       \
  do {                                                                                 \
    CUresult r_ = (call);                                                              \
    if (r_ != CUDA_SUCCESS) {                                                          \
      const char *s_ = nullptr;                                                        \
      cuGetErrorName(r_, &s_);                                                         \
      fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, s_ ? s_ : "?"); \
      exit(2);                                                                         \
    }                                                                                  \
  } while (0)

#define NVRTC(call)                                                                             \
  do {                                                                                          \
    nvrtcResult r_ = (call);                                                                    \
    if (r_ != NVRTC_SUCCESS) {                                                                  \
      fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, nvrtcGetErrorString(r_)); \
      exit(2);                                                                                  \
    }                                                                                           \
  } while (0)

static const char *kSource = R"(
extern "C" __global__ void spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
extern "C" __global__ void fill(int *p, int n, int mul, int add) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = i * mul + add;
}
extern "C" __global__ void copy_plus(const int *in, int *out, int n, int add) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] + add;
}
)";

static const int N = 1 << 16;

// Compiles kSource for this device: PTX (JIT by the driver) or a CUBIN.
static std::vector<char> compile(CUdevice dev, bool cubin) {
  int major = 0, minor = 0;
  CU(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  CU(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  char arch[64];
  snprintf(arch, sizeof arch, "--gpu-architecture=%s_%d%d", cubin ? "sm" : "compute", major, minor);
  nvrtcProgram prog;
  NVRTC(nvrtcCreateProgram(&prog, kSource, "conformance.cu", 0, nullptr, nullptr));
  const char *opts[] = {arch};
  nvrtcResult r = nvrtcCompileProgram(prog, 1, opts);
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::vector<char> log(n + 1);
    nvrtcGetProgramLog(prog, log.data());
    fprintf(stderr, "nvrtc: %s\n%s\n", nvrtcGetErrorString(r), log.data());
    exit(2);
  }
  size_t n = 0;
  std::vector<char> image;
  if (cubin) {
    NVRTC(nvrtcGetCUBINSize(prog, &n));
    image.resize(n);
    NVRTC(nvrtcGetCUBIN(prog, image.data()));
  } else {
    NVRTC(nvrtcGetPTXSize(prog, &n));
    image.resize(n);
    NVRTC(nvrtcGetPTX(prog, image.data()));
  }
  NVRTC(nvrtcDestroyProgram(&prog));
  return image;
}

static void launch(CUfunction f, CUstream s, int grid, void **args) {
  CU(cuLaunchKernel(f, grid, 1, 1, grid == 1 ? 1 : 256, 1, 1, 0, s, args, nullptr));
}

static void spin_on(CUfunction spin, CUstream s, double ms) {
  unsigned long long ns = (unsigned long long)(ms * 1e6);
  void *args[] = {&ns};
  launch(spin, s, 1, args);
}

static void fill_on(CUfunction fill, CUstream s, CUdeviceptr p, int mul, int add) {
  int n = N;
  void *args[] = {&p, &n, &mul, &add};
  launch(fill, s, blocks_for(N), args);
}

static std::vector<int> read_back(CUdeviceptr p) {
  std::vector<int> v(N);
  CU(cuMemcpyDtoH(v.data(), p, N * sizeof(int)));
  return v;
}

int main() {
  CU(cuInit(0));
  CUdevice dev;
  CU(cuDeviceGet(&dev, 0));
  CUcontext primary;
  CU(cuDevicePrimaryCtxRetain(&primary, dev));
  CU(cuCtxSetCurrent(primary));
  std::vector<char> ptx = compile(dev, false), cubin = compile(dev, true);

  CUstream s;
  CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr buf, out;
  CU(cuMemAlloc(&buf, N * sizeof(int)));
  CU(cuMemAlloc(&out, N * sizeof(int)));

  // 1. cuModuleUnload right after queueing launches of the module's kernels (PTX, then CUBIN).
  for (int variant = 0; variant < 2; variant++) {
    CUmodule m;
    CU(cuModuleLoadData(&m, variant ? cubin.data() : ptx.data()));
    CUfunction spin, fill;
    CU(cuModuleGetFunction(&spin, m, "spin"));
    CU(cuModuleGetFunction(&fill, m, "fill"));
    spin_on(spin, s, 100.0);
    fill_on(fill, s, buf, 5 + variant, 3);
    CU(cuModuleUnload(m));
    CU(cuStreamSynchronize(s));
    std::vector<int> v = read_back(buf);
    expect_affine(v, 5 + variant, 3, variant ? "module_unload_cubin_pending" : "module_unload_ptx_pending");
    g_digest.add_vec(v);
  }

  // 2. cuLibraryUnload with pending launches of its context-independent kernels.
  {
    CUlibrary lib;
    CU(cuLibraryLoadData(&lib, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
    CUkernel kspin, kfill;
    CU(cuLibraryGetKernel(&kspin, lib, "spin"));
    CU(cuLibraryGetKernel(&kfill, lib, "fill"));
    spin_on((CUfunction)kspin, s, 100.0);
    fill_on((CUfunction)kfill, s, buf, 9, 1);
    CU(cuLibraryUnload(lib));
    CU(cuStreamSynchronize(s));
    std::vector<int> v = read_back(buf);
    expect_affine(v, 9, 1, "library_unload_pending");
    g_digest.add_vec(v);
  }

  CUmodule m;
  CU(cuModuleLoadData(&m, cubin.data()));
  CUfunction spin, fill, copy_plus;
  CU(cuModuleGetFunction(&spin, m, "spin"));
  CU(cuModuleGetFunction(&fill, m, "fill"));
  CU(cuModuleGetFunction(&copy_plus, m, "copy_plus"));

  // 3. Stream memory operations. Waiter (high priority) waits for a device-memory flag that a
  // low-priority producer writes after a spin and the data it guards.
  int lo = 0, hi = 0;
  CU(cuCtxGetStreamPriorityRange(&lo, &hi));
  CUstream producer, waiter;
  CU(cuStreamCreateWithPriority(&producer, CU_STREAM_NON_BLOCKING, lo));
  CU(cuStreamCreateWithPriority(&waiter, CU_STREAM_NON_BLOCKING, hi));
  CUdeviceptr flag;
  CU(cuMemAlloc(&flag, sizeof(int)));
  CU(cuMemsetD32(flag, 0, 1));
  CU(cuCtxSynchronize());
  for (unsigned round = 1; round <= 8; round++) {
    CU(cuStreamWaitValue32(waiter, flag, round, CU_STREAM_WAIT_VALUE_GEQ));
    int n = N, add = (int)round;
    void *args[] = {&buf, &out, &n, &add};
    launch(copy_plus, waiter, blocks_for(N), args);  // out = buf + round
    spin_on(spin, producer, round == 1 ? 80.0 : 5.0);
    fill_on(fill, producer, buf, (int)round, 0);  // buf = round * i
    CU(cuStreamWriteValue32(producer, flag, round, CU_STREAM_WRITE_VALUE_DEFAULT));
    CU(cuStreamSynchronize(waiter));
    std::vector<int> v = read_back(out);
    char name[64];
    snprintf(name, sizeof name, "wait_value_orders_streams_%u", round);
    expect_affine(v, (int)round, (int)round, name);
    g_digest.add_vec(v);
  }

  // 4. A wait released by the host: until the host writes the mapped flag the guarded kernel has
  // not run; afterwards it runs without any further API call from the host but a sync.
  int *hflag = nullptr;
  CU(cuMemHostAlloc((void **)&hflag, sizeof(int), CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  *(volatile int *)hflag = 0;
  CUdeviceptr hflag_d;
  CU(cuMemHostGetDevicePointer(&hflag_d, hflag, 0));
  int *hres = nullptr;
  CU(cuMemHostAlloc((void **)&hres, sizeof(int), CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  *(volatile int *)hres = 0;
  CUdeviceptr hres_d;
  CU(cuMemHostGetDevicePointer(&hres_d, hres, 0));
  CU(cuStreamWaitValue32(waiter, hflag_d, 1, CU_STREAM_WAIT_VALUE_EQ));
  CU(cuStreamWriteValue32(waiter, hres_d, 42, CU_STREAM_WRITE_VALUE_DEFAULT));
  double t0 = now_s();
  while (now_s() - t0 < 0.05) {
  }
  check(*(volatile int *)hres == 0 && cuStreamQuery(waiter) == CUDA_ERROR_NOT_READY, "host_gated_wait_holds");
  *(volatile int *)hflag = 1;
  // Progress without a sync call: the host sees the write land by polling.
  t0 = now_s();
  while (*(volatile int *)hres != 42 && now_s() - t0 < 20) {
  }
  check(*(volatile int *)hres == 42, "host_released_wait_runs_without_sync");
  CU(cuStreamSynchronize(waiter));

  // 5. cuCtxDestroy of a second context with pending work: the work completes first. Results go
  // to malloc'd host memory registered in that context, which outlives it.
  {
    CUcontext ctx;
    CU(cuCtxCreate(&ctx, nullptr, 0, dev));
    CUmodule m2;
    CU(cuModuleLoadData(&m2, cubin.data()));
    CUfunction spin2, fill2;
    CU(cuModuleGetFunction(&spin2, m2, "spin"));
    CU(cuModuleGetFunction(&fill2, m2, "fill"));
    int *host = (int *)mmap(nullptr, N * sizeof(int), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (host == MAP_FAILED) return 3;
    CU(cuMemHostRegister(host, N * sizeof(int), CU_MEMHOSTREGISTER_DEVICEMAP));
    CUdeviceptr host_d;
    CU(cuMemHostGetDevicePointer(&host_d, host, 0));
    CUstream s2;
    CU(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    spin_on(spin2, s2, 150.0);
    fill_on(fill2, s2, host_d, 21, 2);
    CU(cuCtxDestroy(ctx));
    std::vector<int> v(host, host + N);
    expect_affine(v, 21, 2, "ctx_destroy_lets_pending_work_finish");
    g_digest.add_vec(v);
    munmap(host, N * sizeof(int));
    CU(cuCtxSetCurrent(primary));
  }

  // The primary context still works.
  fill_on(fill, s, buf, 2, 2);
  CU(cuStreamSynchronize(s));
  std::vector<int> v = read_back(buf);
  expect_affine(v, 2, 2, "primary_ctx_after_destroy");
  CU(cuModuleUnload(m));
  CU(cuMemFreeHost(hflag));
  CU(cuMemFreeHost(hres));
  CU(cuDevicePrimaryCtxRelease(dev));
  return finish();
}
