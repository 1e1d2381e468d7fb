// Green contexts on Hopper: what the driver allows and what confinement buys (issue 10, point 5b).
// One file, three builds (bench/run-green.sh does them on the device):
//   nvcc -cubin -DGREEN_KERNELS_ONLY  -> the kernels alone, loaded with cuModuleLoadData /
//                                         cuLibraryLoadData (path in GREEN_CUBIN)
//   nvcc -o green_probe               -> this program; prints one JSON object per line
//   nvcc -shared -DGREEN_LIB          -> libgreen.so: green_stream() for green_torch.py
// Usage:
//   green_probe res|launch|mem|event  API checks (one section per process, so a sticky error in
//                                     one section cannot spoil the next)
//   green_probe timing CFG inproc|twoproc
//        CFG: lc_alone be_alone prio conf<F> split<F> switch<F>_h<HOLD_US>, F = SMs kept free
//        of BE. inproc: BE and LC are threads of one process; twoproc: BE is a forked child
//        (run it under MPS). Knobs: BE_US BE_WAVES BE_DEPTH LC_US LC_GRID LC_KERNELS LC_N
//        LC_GAP_US PATTERN=poisson|burst.
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
// Every block spins ns nanoseconds of wall time; block 0's thread 0 of each block counts it done.
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

static const char *cu_name(CUresult r) {
  const char *s = nullptr;
  cuGetErrorName(r, &s);
  return s ? s : "?";
}
static double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
static int env_int(const char *k, int d) {
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
static Green make_green(CUdevice dev, unsigned keep_free, int prio) {
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

static std::vector<char> read_file(const char *path) {
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
static CUresult load_in(CUcontext ctx, const std::vector<char> &image, CUmodule *m) {
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
static Common init_common() {
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

// ---------------------------------------------------------------------------------------------
// a. resources

static void section_res() {
  Common c = init_common();
  CUdevResource all{};
  CUresult r = cuDeviceGetDevResource(c.dev, &all, CU_DEV_RESOURCE_TYPE_SM);
  printf("{\"check\":\"dev_resource\",\"rc\":\"%s\",\"sm_count\":%u,\"min_sm_partition_size\":%u,"
         "\"sm_coscheduled_alignment\":%u,\"attr_sms\":%d}\n",
         cu_name(r), all.sm.smCount, all.sm.minSmPartitionSize, all.sm.smCoscheduledAlignment, c.nsm);
  {
    CUmodule m = nullptr;
    CUfunction f = nullptr;
    CUresult lr = cuModuleLoadData(&m, c.image.data());
    if (!lr) lr = cuModuleGetFunction(&f, m, "k_spin");
    int be = 0, lc = 0;
    if (f) cuOccupancyMaxActiveBlocksPerMultiprocessor(&be, f, 1024, 0);
    if (f) cuOccupancyMaxActiveBlocksPerMultiprocessor(&lc, f, 128, 0);
    printf("{\"check\":\"occupancy_k_spin\",\"load_rc\":\"%s\",\"blocks_per_sm_1024\":%d,\"blocks_per_sm_128\":%d}\n",
           cu_name(lr), be, lc);
  }
  for (unsigned flags : {0u, (unsigned)CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING})
  for (unsigned min : {1u, 2u, 4u, 6u, 8u, 12u, 16u, 24u, 32u}) {
    unsigned nb = 0;
    CUresult q = cuDevSmResourceSplitByCount(nullptr, &nb, &all, nullptr, flags, min);
    std::vector<CUdevResource> groups(nb ? nb : 1);
    CUdevResource rem{};
    unsigned nb2 = nb;
    CUresult s = cuDevSmResourceSplitByCount(groups.data(), &nb2, &all, &rem, flags, min);
    unsigned one = 1;
    CUdevResource g1{}, rem1{};
    CUresult s1 = cuDevSmResourceSplitByCount(&g1, &one, &all, &rem1, flags, min);
    printf("{\"check\":\"split\",\"flags\":%u,\"min_count\":%u,\"query_rc\":\"%s\",\"groups\":%u,\"split_rc\":\"%s\","
           "\"group_sms\":%u,\"remaining_sms\":%u,\"one_group_rc\":\"%s\",\"one_group_sms\":%u,"
           "\"one_group_remaining_sms\":%u}\n",
           flags, min, cu_name(q), nb, cu_name(s), nb2 ? groups[0].sm.smCount : 0, rem.sm.smCount,
           cu_name(s1), g1.sm.smCount, rem1.sm.smCount);
  }
  // Several groups of one split combined into one descriptor.
  {
    unsigned nb = 16;
    std::vector<CUdevResource> groups(nb);
    CUdevResource rem{};
    CUresult s = cuDevSmResourceSplitByCount(groups.data(), &nb, &all, &rem, 0, 8);
    CUdevResourceDesc d;
    CUresult gd = cuDevResourceGenerateDesc(&d, groups.data(), 2);
    CUgreenCtx gc = nullptr;
    CUresult gc_rc = gd ? gd : cuGreenCtxCreate(&gc, d, c.dev, CU_GREEN_CTX_DEFAULT_STREAM);
    CUdevResource got{};
    CUresult gr = gc ? cuGreenCtxGetDevResource(gc, &got, CU_DEV_RESOURCE_TYPE_SM) : gc_rc;
    printf("{\"check\":\"desc_of_two_groups\",\"split_rc\":\"%s\",\"desc_rc\":\"%s\",\"ctx_rc\":\"%s\","
           "\"ctx_sms\":%u,\"get_rc\":\"%s\"}\n",
           cu_name(s), cu_name(gd), cu_name(gc_rc), got.sm.smCount, cu_name(gr));
    if (gc) cuGreenCtxDestroy(gc);
  }
  for (unsigned keep : {8u, 16u}) {
    Green g = make_green(c.dev, keep, 0);
    CUdevResource rr{};
    if (!g.rc) cuGreenCtxGetDevResource(g.rest_g, &rr, CU_DEV_RESOURCE_TYPE_SM);
    CUcontext cur = nullptr;
    cuCtxGetCurrent(&cur);
    CUgreenCtx of_stream = nullptr;
    CUresult sg = g.rc ? g.rc : cuStreamGetGreenCtx(g.rest_s, &of_stream);
    CUcontext sctx = nullptr;
    CUresult sc = g.rc ? g.rc : cuStreamGetCtx(g.rest_s, &sctx);
    printf("{\"check\":\"green_ctx\",\"keep_free\":%u,\"rc\":\"%s\",\"failed_step\":\"%s\","
           "\"part_sms\":%u,\"rest_sms\":%u,\"rest_ctx_reports_sms\":%u,\"create_us\":%.1f,"
           "\"current_is_still_primary\":%s,\"stream_green_rc\":\"%s\",\"stream_green_matches\":%s,"
           "\"stream_ctx_rc\":\"%s\",\"stream_ctx_is_green_ctx\":%s,\"stream_ctx_is_primary\":%s}\n",
           keep, cu_name(g.rc), g.step, g.part.sm.smCount, g.rest.sm.smCount, rr.sm.smCount,
           g.create_us, cur == c.prim ? "true" : "false", cu_name(sg),
           of_stream == g.rest_g ? "true" : "false", cu_name(sc),
           sctx == g.rest_ctx ? "true" : "false", sctx == c.prim ? "true" : "false");
  }
}

// ---------------------------------------------------------------------------------------------
// b. which kernel handles launch on a green stream, and where the blocks run

struct Where {
  int *d_sm;
  int n;
};
static void report_launch(const char *name, const char *target, CUresult lrc, Where w, CUstream s) {
  CUresult src = cuStreamSynchronize(s);
  std::vector<int> sm(w.n, -1);
  cudaError_t cp = cudaMemcpy(sm.data(), w.d_sm, w.n * sizeof(int), cudaMemcpyDeviceToHost);
  std::set<int> distinct;
  int ran = 0;
  for (int v : sm)
    if (v >= 0) {
      ran++;
      distinct.insert(v);
    }
  printf("{\"check\":\"launch\",\"handle\":\"%s\",\"stream\":\"%s\",\"launch_rc\":\"%s\",\"sync_rc\":\"%s\","
         "\"copy_rc\":\"%s\",\"blocks\":%d,\"blocks_ran\":%d,\"distinct_sms\":%zu,\"min_sm\":%d,"
         "\"max_sm\":%d}\n",
         name, target, cu_name(lrc), cu_name(src), cudaGetErrorName(cp), w.n, ran, distinct.size(),
         distinct.empty() ? -1 : *distinct.begin(), distinct.empty() ? -1 : *distinct.rbegin());
  cudaMemset(w.d_sm, 0xff, w.n * sizeof(int));
  cudaDeviceSynchronize();
}
static void launch_fn(const char *name, const char *target, CUfunction f, CUstream s, Where w) {
  void *args[] = {&w.d_sm, &w.n};
  CUresult r = cuLaunchKernel(f, w.n, 1, 1, 128, 1, 1, 0, s, args, nullptr);
  report_launch(name, target, r, w, s);
}

static void section_launch() {
  Common c = init_common();
  Green g = make_green(c.dev, 8, 0);
  if (g.rc) {
    printf("{\"check\":\"launch_setup\",\"rc\":\"%s\",\"failed_step\":\"%s\"}\n", cu_name(g.rc), g.step);
    return;
  }
  Where w{nullptr, 4 * c.nsm};
  cudaMalloc(&w.d_sm, w.n * sizeof(int));
  cudaMemset(w.d_sm, 0xff, w.n * sizeof(int));
  CUstream prim_s;
  cuStreamCreate(&prim_s, CU_STREAM_NON_BLOCKING);
  // A plain stream of the green context's CUcontext (cuCtxFromGreenCtx) instead of
  // cuGreenCtxStreamCreate.
  CUstream alt_s = nullptr;
  CUresult alt_rc = cuCtxPushCurrent(g.part_ctx);
  if (!alt_rc) {
    alt_rc = cuStreamCreate(&alt_s, CU_STREAM_NON_BLOCKING);
    CUcontext d;
    cuCtxPopCurrent(&d);
  }
  printf("{\"check\":\"stream_of_green_ctxfrom\",\"rc\":\"%s\"}\n", cu_name(alt_rc));
  struct T {
    const char *name;
    CUstream s;
  } targets[] = {{"primary", prim_s}, {"green_rest", g.rest_s}, {"green_part", g.part_s},
                 {"green_part_via_ctx", alt_s}};
  // 1. cuModuleLoadData in the primary context.
  CUmodule mp = nullptr;
  CUfunction fp = nullptr;
  CUresult r = cuModuleLoadData(&mp, c.image.data());
  if (!r) r = cuModuleGetFunction(&fp, mp, "k_mark");
  printf("{\"check\":\"module_primary_load\",\"rc\":\"%s\",\"image_bytes\":%zu}\n", cu_name(r), c.image.size());
  // 2. cuLibraryLoadData: a context-independent CUkernel.
  CUlibrary lib = nullptr;
  CUkernel kern = nullptr;
  CUresult lr = cuLibraryLoadData(&lib, c.image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (!lr) lr = cuLibraryGetKernel(&kern, lib, "k_mark");
  printf("{\"check\":\"library_load\",\"rc\":\"%s\"}\n", cu_name(lr));
  // 3. the CUfunction of that CUkernel in the primary context (cuKernelGetFunction).
  CUfunction fk = nullptr;
  CUresult kr = lr ? lr : cuKernelGetFunction(&fk, kern);
  // 4. the same module loaded into the green context.
  CUmodule mg = nullptr;
  CUfunction fg = nullptr;
  CUresult gr = load_in(g.part_ctx, c.image, &mg);
  if (!gr) gr = cuModuleGetFunction(&fg, mg, "k_mark");
  printf("{\"check\":\"module_green_load\",\"rc\":\"%s\"}\n", cu_name(gr));
  // 5. the runtime's handles of the kernel compiled into this program.
  cudaFunction_t rf = nullptr;
  cudaError_t rfe = cudaGetFuncBySymbol(&rf, (const void *)k_mark);
  cudaKernel_t rk = nullptr;
  cudaError_t rke = cudaGetKernel(&rk, (const void *)k_mark);
  CUfunction rkf = nullptr;
  CUresult rkfr = rk ? cuKernelGetFunction(&rkf, (CUkernel)rk) : CUDA_ERROR_INVALID_HANDLE;
  printf("{\"check\":\"runtime_handles\",\"get_func_by_symbol\":\"%s\",\"get_kernel\":\"%s\","
         "\"func_equals_kernel\":%s,\"kernel_get_function_rc\":\"%s\",\"func_equals_function_of_kernel\":%s}\n",
         cudaGetErrorName(rfe), cudaGetErrorName(rke), (void *)rf == (void *)rk ? "true" : "false",
         cu_name(rkfr), (void *)rf == (void *)rkf ? "true" : "false");
  for (T t : targets) {
    if (!t.s) continue;
    if (fp) launch_fn("module_primary", t.name, fp, t.s, w);
    if (kern) launch_fn("library_kernel_as_function", t.name, (CUfunction)kern, t.s, w);
    if (fk) launch_fn("cuKernelGetFunction_primary", t.name, fk, t.s, w);
    if (fg) launch_fn("module_green_part", t.name, fg, t.s, w);
    if (rf) launch_fn("cudaGetFuncBySymbol", t.name, (CUfunction)rf, t.s, w);
    if (rk) launch_fn("cudaGetKernel_as_function", t.name, (CUfunction)rk, t.s, w);
    k_mark<<<w.n, 128, 0, (cudaStream_t)t.s>>>(w.d_sm, w.n);
    cudaError_t le = cudaGetLastError();
    report_launch("runtime_triple_chevron", t.name, le == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN, w, t.s);
    if (le) printf("{\"check\":\"runtime_triple_chevron_error\",\"stream\":\"%s\",\"err\":\"%s\"}\n", t.name, cudaGetErrorName(le));
    void *args[] = {&w.d_sm, &w.n};
    le = cudaLaunchKernel((const void *)k_mark, dim3(w.n), dim3(128), args, 0, (cudaStream_t)t.s);
    report_launch("cudaLaunchKernel", t.name, le == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN, w, t.s);
    if (le) printf("{\"check\":\"cudaLaunchKernel_error\",\"stream\":\"%s\",\"err\":\"%s\"}\n", t.name, cudaGetErrorName(le));
  }
  // With the green context current: the runtime launch on its default (legacy) stream.
  cuCtxPushCurrent(g.part_ctx);
  k_mark<<<w.n, 128>>>(w.d_sm, w.n);
  cudaError_t le = cudaGetLastError();
  CUcontext d;
  report_launch("runtime_green_current_default_stream", "null", le == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN, w, nullptr);
  cuCtxPopCurrent(&d);
}

// ---------------------------------------------------------------------------------------------
// c. memory and events across the primary and a green context

static CUfunction fn_of(CUmodule m, const char *name) {
  CUfunction f = nullptr;
  if (m) cuModuleGetFunction(&f, m, name);
  return f;
}
static CUresult launch_add(CUfunction f, CUstream s, int *p, int n) {
  void *args[] = {&p, &n};
  return cuLaunchKernel(f, (n + 255) / 256, 1, 1, 256, 1, 1, 0, s, args, nullptr);
}
static void check_add(const char *what, CUresult alloc_rc, int *p, int n, CUfunction f, CUstream s) {
  if (alloc_rc || !p) {
    printf("{\"check\":\"mem\",\"what\":\"%s\",\"alloc_rc\":\"%s\"}\n", what, cu_name(alloc_rc));
    return;
  }
  std::vector<int> h(n);
  for (int i = 0; i < n; i++) h[i] = i;
  CUresult w = cuMemcpyHtoD((CUdeviceptr)p, h.data(), n * sizeof(int));
  // A pageable copy may return before its DMA lands, and the kernel runs on another
  // (non-blocking) stream: wait for the device first.
  cudaDeviceSynchronize();
  CUresult l = launch_add(f, s, p, n);
  CUresult sy = cuStreamSynchronize(s);
  std::fill(h.begin(), h.end(), -1);
  CUresult rd = cuMemcpyDtoH(h.data(), (CUdeviceptr)p, n * sizeof(int));
  int bad = 0;
  for (int i = 0; i < n; i++) bad += h[i] != i + 1;
  printf("{\"check\":\"mem\",\"what\":\"%s\",\"alloc_rc\":\"CUDA_SUCCESS\",\"write_rc\":\"%s\",\"launch_rc\":\"%s\","
         "\"sync_rc\":\"%s\",\"read_rc\":\"%s\",\"wrong_values\":%d,\"n\":%d}\n",
         what, cu_name(w), cu_name(l), cu_name(sy), cu_name(rd), bad, n);
}

static void section_mem() {
  Common c = init_common();
  Green g = make_green(c.dev, 8, 0);
  if (g.rc) {
    printf("{\"check\":\"mem_setup\",\"rc\":\"%s\",\"failed_step\":\"%s\"}\n", cu_name(g.rc), g.step);
    return;
  }
  CUmodule mg = nullptr, mp = nullptr;
  load_in(g.rest_ctx, c.image, &mg);
  cuModuleLoadData(&mp, c.image.data());
  CUfunction fg = fn_of(mg, "k_add"), fp = fn_of(mp, "k_add");
  CUstream ps;
  cuStreamCreate(&ps, CU_STREAM_NON_BLOCKING);
  const int n = 1 << 20;
  int *p = nullptr;
  cudaError_t e = cudaMalloc(&p, n * sizeof(int));
  check_add("cudaMalloc_primary_used_on_green", e ? CUDA_ERROR_UNKNOWN : CUDA_SUCCESS, p, n, fg, g.rest_s);
  CUdeviceptr dp = 0;
  CUresult r = cuMemAlloc(&dp, n * sizeof(int));
  check_add("cuMemAlloc_primary_used_on_green", r, (int *)dp, n, fg, g.rest_s);
  // Allocated with the green context current, used from the primary context.
  cuCtxPushCurrent(g.rest_ctx);
  CUdeviceptr dg = 0;
  r = cuMemAlloc(&dg, n * sizeof(int));
  CUcontext d;
  cuCtxPopCurrent(&d);
  check_add("cuMemAlloc_green_used_on_primary", r, (int *)dg, n, fp, ps);
  // Stream-ordered allocations: on a primary stream, then used on the green stream.
  int *pa = nullptr;
  e = cudaMallocAsync(&pa, n * sizeof(int), (cudaStream_t)ps);
  cudaStreamSynchronize((cudaStream_t)ps);
  check_add("cudaMallocAsync_primary_stream_used_on_green", e ? CUDA_ERROR_UNKNOWN : CUDA_SUCCESS, pa, n, fg, g.rest_s);
  // ... and on the green stream itself.
  int *pga = nullptr;
  e = cudaMallocAsync(&pga, n * sizeof(int), (cudaStream_t)g.rest_s);
  printf("{\"check\":\"cudaMallocAsync_on_green_stream\",\"err\":\"%s\"}\n", cudaGetErrorName(e));
  cudaStreamSynchronize((cudaStream_t)g.rest_s);
  check_add("cudaMallocAsync_green_stream_used_on_green", e ? CUDA_ERROR_UNKNOWN : CUDA_SUCCESS, pga, n, fg, g.rest_s);
  if (!e) {
    e = cudaFreeAsync(pga, (cudaStream_t)g.rest_s);
    printf("{\"check\":\"cudaFreeAsync_on_green_stream\",\"err\":\"%s\"}\n", cudaGetErrorName(e));
  }
  CUdeviceptr cga = 0;
  r = cuMemAllocAsync(&cga, n * sizeof(int), g.rest_s);
  cuStreamSynchronize(g.rest_s);
  check_add("cuMemAllocAsync_green_stream_used_on_primary", r, (int *)cga, n, fp, ps);
  // Runtime copies on the green stream.
  std::vector<int> h(n, 7), back(n, 0);
  e = cudaMemcpyAsync(p, h.data(), n * sizeof(int), cudaMemcpyHostToDevice, (cudaStream_t)g.rest_s);
  cudaError_t e2 = cudaMemcpyAsync(back.data(), p, n * sizeof(int), cudaMemcpyDeviceToHost, (cudaStream_t)g.rest_s);
  cudaError_t e3 = cudaStreamSynchronize((cudaStream_t)g.rest_s);
  printf("{\"check\":\"cudaMemcpyAsync_on_green_stream\",\"h2d\":\"%s\",\"d2h\":\"%s\",\"sync\":\"%s\",\"ok\":%s}\n",
         cudaGetErrorName(e), cudaGetErrorName(e2), cudaGetErrorName(e3), back == h ? "true" : "false");
  // Host-mapped pinned memory written by a green-stream kernel.
  int *hp = nullptr, *hdp = nullptr;
  cudaHostAlloc(&hp, n * sizeof(int), cudaHostAllocMapped);
  cudaHostGetDevicePointer(&hdp, hp, 0);
  check_add("cudaHostAllocMapped_used_on_green", hdp ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN, hdp, n, fg, g.rest_s);
}

// Ordering: a producer waits ~5 ms then sets a flag; a consumer on the other stream copies the
// flag after waiting on the producer's event. The copy reads 1 only if the wait held.
static void order_check(const char *what, CUfunction set_f, CUstream prod, CUfunction copy_f, CUstream cons,
                        CUevent ev, int *flag, int *out) {
  cudaMemset(flag, 0, 4);
  cudaMemset(out, 0xff, 4);
  cudaDeviceSynchronize();
  int one = 1;
  unsigned long long ns = 5000000;
  void *a1[] = {&flag, &one, &ns};
  CUresult l1 = cuLaunchKernel(set_f, 1, 1, 1, 1, 1, 1, 0, prod, a1, nullptr);
  CUresult rec = cuEventRecord(ev, prod);
  CUresult wt = cuStreamWaitEvent(cons, ev, 0);
  void *a2[] = {&out, &flag};
  CUresult l2 = cuLaunchKernel(copy_f, 1, 1, 1, 1, 1, 1, 0, cons, a2, nullptr);
  CUresult s1 = cuStreamSynchronize(cons);
  int got = -1;
  cudaMemcpy(&got, out, 4, cudaMemcpyDeviceToHost);
  CUresult q = cuEventQuery(ev);
  cuStreamSynchronize(prod);
  printf("{\"check\":\"order\",\"what\":\"%s\",\"set_rc\":\"%s\",\"record_rc\":\"%s\",\"wait_rc\":\"%s\","
         "\"copy_rc\":\"%s\",\"sync_rc\":\"%s\",\"event_done_when_consumer_done\":\"%s\",\"consumer_saw\":%d,"
         "\"ordered\":%s}\n",
         what, cu_name(l1), cu_name(rec), cu_name(wt), cu_name(l2), cu_name(s1), cu_name(q), got,
         got == 1 ? "true" : "false");
}

static void section_event() {
  Common c = init_common();
  Green g = make_green(c.dev, 8, 0);
  if (g.rc) {
    printf("{\"check\":\"event_setup\",\"rc\":\"%s\",\"failed_step\":\"%s\"}\n", cu_name(g.rc), g.step);
    return;
  }
  CUmodule mg = nullptr, mp = nullptr;
  load_in(g.rest_ctx, c.image, &mg);
  cuModuleLoadData(&mp, c.image.data());
  CUstream ps;
  cuStreamCreate(&ps, CU_STREAM_NON_BLOCKING);
  int *flag, *out;
  cudaMalloc(&flag, 4);
  cudaMalloc(&out, 4);
  CUevent ep, eg;
  cuEventCreate(&ep, CU_EVENT_DISABLE_TIMING);
  cuCtxPushCurrent(g.rest_ctx);
  CUresult egr = cuEventCreate(&eg, CU_EVENT_DISABLE_TIMING);
  CUcontext d;
  cuCtxPopCurrent(&d);
  printf("{\"check\":\"event_create_in_green\",\"rc\":\"%s\"}\n", cu_name(egr));
  CUfunction set_p = fn_of(mp, "k_set_after"), copy_p = fn_of(mp, "k_copy");
  CUfunction set_g = fn_of(mg, "k_set_after"), copy_g = fn_of(mg, "k_copy");
  order_check("primary_event_primary_to_green", set_p, ps, copy_g, g.rest_s, ep, flag, out);
  order_check("primary_event_green_to_primary", set_g, g.rest_s, copy_p, ps, ep, flag, out);
  if (!egr) {
    order_check("green_event_green_to_primary", set_g, g.rest_s, copy_p, ps, eg, flag, out);
    order_check("green_event_primary_to_green", set_p, ps, copy_g, g.rest_s, eg, flag, out);
  }
  // Between the two green contexts.
  CUmodule mpart = nullptr;
  load_in(g.part_ctx, c.image, &mpart);
  order_check("primary_event_green_rest_to_green_part", set_g, g.rest_s, fn_of(mpart, "k_copy"), g.part_s, ep,
              flag, out);
  // The runtime's events across the two.
  cudaEvent_t re;
  cudaEventCreateWithFlags(&re, cudaEventDisableTiming);
  order_check("runtime_event_green_to_primary", set_g, g.rest_s, copy_p, ps, (CUevent)re, flag, out);
  // Without a wait: the consumer must NOT see the flag (shows the check can fail).
  cudaMemset(flag, 0, 4);
  cudaDeviceSynchronize();
  int one = 1, got = -1;
  unsigned long long ns = 5000000;
  void *a1[] = {&flag, &one, &ns};
  cuLaunchKernel(set_p, 1, 1, 1, 1, 1, 1, 0, ps, a1, nullptr);
  void *a2[] = {&out, &flag};
  cuLaunchKernel(copy_g, 1, 1, 1, 1, 1, 1, 0, g.rest_s, a2, nullptr);
  cuStreamSynchronize(g.rest_s);
  cudaMemcpy(&got, out, 4, cudaMemcpyDeviceToHost);
  cuStreamSynchronize(ps);
  printf("{\"check\":\"order_control_no_wait\",\"consumer_saw\":%d}\n", got);
}

// ---------------------------------------------------------------------------------------------
// e. timing: LC requests against a GPU-filling BE spin workload

struct Shared {
  std::atomic<int> lc_active;
  std::atomic<int> measure;  // 1 while the measured window runs
  std::atomic<int> stop;
  std::atomic<int> be_ready;
  std::atomic<double> lc_last_end_us;
  // BE results
  double be_blocks_per_s, switch_host_us;
  long long be_kernels, switches, be_green_kernels;
  char be_err[160];
};

struct Cfg {
  std::string name;
  bool lc = true, be = true;
  enum { FULL, CONF, SPLIT, SWITCH } be_mode = FULL;
  unsigned keep_free = 8;
  double hold_us = 0;
};
static Cfg parse(const std::string &s) {
  Cfg c;
  c.name = s;
  if (s == "lc_alone") c.be = false;
  else if (s == "be_alone") c.lc = false;
  else if (s == "prio") c.be_mode = Cfg::FULL;
  else if (s.rfind("conf", 0) == 0) c.be_mode = Cfg::CONF, c.keep_free = atoi(s.c_str() + 4);
  else if (s.rfind("split", 0) == 0) c.be_mode = Cfg::SPLIT, c.keep_free = atoi(s.c_str() + 5);
  else if (s.rfind("switch", 0) == 0) {
    c.be_mode = Cfg::SWITCH;
    c.keep_free = atoi(s.c_str() + 6);
    auto h = s.find("_h");
    if (h != std::string::npos) c.hold_us = atof(s.c_str() + h + 2);
  } else {
    fprintf(stderr, "unknown config %s\n", s.c_str());
    exit(2);
  }
  return c;
}

#define BE_TRY(call)                                                                         \
  do {                                                                                       \
    CUresult r_ = (call);                                                                    \
    if (r_ && !sh->be_err[0]) snprintf(sh->be_err, sizeof sh->be_err, "%s: %s", #call, cu_name(r_)); \
  } while (0)

static void be_role(const Cfg &cfg, Shared *sh, Common &c) {
  int least, greatest;
  cudaDeviceGetStreamPriorityRange(&least, &greatest);
  Green g;
  CUstream full;
  cuStreamCreateWithPriority(&full, CU_STREAM_NON_BLOCKING, least);
  CUmodule mp = nullptr, mg = nullptr;
  cuModuleLoadData(&mp, c.image.data());
  CUfunction fp = fn_of(mp, "k_spin"), fg = nullptr;
  if (cfg.be_mode != Cfg::FULL) {
    g = make_green(c.dev, cfg.keep_free, least);
    if (g.rc) {
      snprintf(sh->be_err, sizeof sh->be_err, "%s: %s", g.step, cu_name(g.rc));
      sh->be_ready = 1;
      return;
    }
    load_in(g.rest_ctx, c.image, &mg);
    fg = fn_of(mg, "k_spin");
  }
  // Finished blocks, counted in device memory (GPU accesses to host-mapped memory are slow
  // enough to delay other work: bench/results/2026-11-23-h100-green-contexts.md) and read with a
  // copy on a stream of its own.
  unsigned long long *done_d = nullptr;
  cudaMalloc(&done_d, 8);
  cudaMemset(done_d, 0, 8);
  cudaDeviceSynchronize();
  CUstream rd;
  cuStreamCreate(&rd, CU_STREAM_NON_BLOCKING);
  auto done_now = [&]() {
    unsigned long long v = 0;
    cuMemcpyDtoHAsync(&v, (CUdeviceptr)done_d, 8, rd);
    cuStreamSynchronize(rd);
    return v;
  };
  unsigned long long ns = (unsigned long long)env_int("BE_US", 200) * 1000;
  int threads = 1024, grid = 2 * c.nsm * env_int("BE_WAVES", 10), depth = env_int("BE_DEPTH", 2);
  std::vector<CUevent> ring(depth);
  for (auto &e : ring) cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
  CUevent sw;
  cuEventCreate(&sw, CU_EVENT_DISABLE_TIMING);
  CUstream cur = full;
  long long i = 0, i0 = 0, switches = 0, green_k = 0;
  double sw_us = 0, t0 = 0;
  unsigned long long d0 = 0;
  bool measuring = false;
  sh->be_ready = 1;
  while (!sh->stop) {
    if (!measuring && sh->measure) {
      measuring = true;
      t0 = now_us();
      d0 = done_now();
      i0 = i;
      switches = 0, green_k = 0, sw_us = 0;
    }
    CUevent e = ring[i % depth];
    if (i >= depth)
      while (cuEventQuery(e) == CUDA_ERROR_NOT_READY && !sh->stop) {
      }
    bool lc = sh->lc_active || now_us() - sh->lc_last_end_us.load() < cfg.hold_us;
    bool green = cfg.be_mode == Cfg::CONF || cfg.be_mode == Cfg::SPLIT || (cfg.be_mode == Cfg::SWITCH && lc);
    CUstream want = green ? g.rest_s : full;
    if (want != cur) {
      double a = now_us();
      BE_TRY(cuEventRecord(sw, cur));
      BE_TRY(cuStreamWaitEvent(want, sw, 0));
      sw_us += now_us() - a;
      switches++;
      cur = want;
    }
    void *args[] = {&ns, &done_d};
    BE_TRY(cuLaunchKernel(green ? fg : fp, grid, 1, 1, threads, 1, 1, 0, cur, args, nullptr));
    BE_TRY(cuEventRecord(e, cur));
    green_k += green;
    i++;
  }
  double dt = now_us() - t0;
  unsigned long long d1 = done_now();
  sh->be_blocks_per_s = measuring ? (d1 - d0) / (dt * 1e-6) : 0;
  sh->be_kernels = i - i0;
  sh->switches = switches;
  sh->be_green_kernels = green_k;
  sh->switch_host_us = switches ? sw_us / switches : 0;
  cuCtxSynchronize();
}

static double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t k = (size_t)std::ceil(p * v.size());  // nearest rank
  return v[std::min(v.size() - 1, k ? k - 1 : 0)];
}

static void lc_role(const Cfg &cfg, Shared *sh, Common &c, std::vector<double> &lat, std::vector<double> &first,
                    std::string &err) {
  int least, greatest;
  cudaDeviceGetStreamPriorityRange(&least, &greatest);
  CUstream s;
  CUfunction f;
  CUmodule m = nullptr;
  Green g;
  if (cfg.be_mode == Cfg::SPLIT) {
    g = make_green(c.dev, cfg.keep_free, greatest);
    if (g.rc) {
      err = std::string("lc green: ") + g.step + ": " + cu_name(g.rc);
      return;
    }
    s = g.part_s;
    load_in(g.part_ctx, c.image, &m);
  } else {
    cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, greatest);
    cuModuleLoadData(&m, c.image.data());
  }
  f = fn_of(m, "k_spin");
  unsigned long long ns = (unsigned long long)env_int("LC_US", 10) * 1000, *nodone = nullptr;
  int grid = env_int("LC_GRID", 8), kernels = env_int("LC_KERNELS", 4), n = env_int("LC_N", 2000);
  double gap = env_int("LC_GAP_US", 1000);
  bool burst = getenv("PATTERN") && !strcmp(getenv("PATTERN"), "burst");
  void *args[] = {&ns, &nodone};
  std::mt19937_64 rng(42);
  std::exponential_distribution<double> expo(1.0 / gap);
  auto request = [&]() -> double {
    double t = now_us();
    sh->lc_active = 1;
    for (int k = 0; k < kernels; k++) {
      CUresult r = cuLaunchKernel(f, grid, 1, 1, 128, 1, 1, 0, s, args, nullptr);
      if (r && err.empty()) err = std::string("lc launch: ") + cu_name(r);
    }
    CUresult r = cuStreamSynchronize(s);
    if (r && err.empty()) err = std::string("lc sync: ") + cu_name(r);
    double l = now_us() - t;
    sh->lc_active = 0;
    sh->lc_last_end_us = now_us();
    return l;
  };
  for (int w = 0; w < 50; w++) request();  // warm-up, BE not yet measured
  sh->lc_last_end_us = 0;
  usleep(20000);
  sh->measure = 1;
  double next = now_us();
  for (int r = 0; r < n; r++) {
    bool first_of_burst = burst && r % 20 == 0;
    if (burst) next += first_of_burst ? 30000 : 500;
    else next += expo(rng);
    while (now_us() < next) {
    }
    double l = request();
    lat.push_back(l);
    if (first_of_burst) first.push_back(l);
  }
}

static void timing(const std::string &cfgname, bool twoproc) {
  Cfg cfg = parse(cfgname);
  Shared *sh = (Shared *)mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  memset((void *)sh, 0, sizeof(Shared));
  pid_t child = 0;
  std::thread be_thread;
  if (cfg.be && twoproc) {
    child = fork();
    if (child == 0) {
      Common c = init_common();
      be_role(cfg, sh, c);
      _exit(0);
    }
  }
  Common c = init_common();
  if (cfg.be && !twoproc)
    be_thread = std::thread([&] {
      cuCtxSetCurrent(c.prim);
      be_role(cfg, sh, c);
    });
  if (cfg.be)
    while (!sh->be_ready) usleep(1000);
  usleep(50000);  // BE fills the GPU
  std::vector<double> lat, first;
  std::string err;
  double t = now_us();
  if (cfg.lc) {
    lc_role(cfg, sh, c, lat, first, err);
  } else {
    sh->measure = 1;
    usleep(2000000);
  }
  double window = now_us() - t;
  sh->stop = 1;
  if (be_thread.joinable()) be_thread.join();
  if (child) waitpid(child, nullptr, 0);
  printf("{\"cfg\":\"%s\",\"procs\":\"%s\",\"pattern\":\"%s\",\"keep_free\":%u,\"hold_us\":%.0f,\"lc_n\":%zu,"
         "\"lc_p50_us\":%.1f,\"lc_p90_us\":%.1f,\"lc_p99_us\":%.1f,\"lc_max_us\":%.1f,\"first_of_burst_p50_us\":%.1f,"
         "\"first_of_burst_p99_us\":%.1f,\"be_blocks_per_s\":%.1f,\"be_kernels\":%lld,\"be_green_kernels\":%lld,"
         "\"switches\":%lld,\"switch_host_us\":%.2f,\"window_s\":%.2f,\"lc_err\":\"%s\",\"be_err\":\"%s\"}\n",
         cfg.name.c_str(), twoproc ? "two" : "one", getenv("PATTERN") ? getenv("PATTERN") : "poisson",
         cfg.keep_free, cfg.hold_us, lat.size(), pct(lat, .5), pct(lat, .9), pct(lat, .99),
         lat.empty() ? 0 : *std::max_element(lat.begin(), lat.end()), pct(first, .5), pct(first, .99),
         sh->be_blocks_per_s, sh->be_kernels, sh->be_green_kernels, sh->switches, sh->switch_host_us,
         window * 1e-6, err.c_str(), sh->be_err);
}

#ifdef GREEN_LIB
// For green_torch.py: a stream of a green context holding all SMs but `keep_free` (or, with
// part != 0, of the `keep_free` split off), priority `prio`; 0 on failure (rc in *rc_out).
extern "C" void *green_stream(int keep_free, int part, int prio, int *rc_out, int *sms_out) {
  cuInit(0);
  CUdevice dev;
  cuDeviceGet(&dev, 0);
  Green g = make_green(dev, keep_free, prio);
  *rc_out = g.rc;
  *sms_out = part ? g.part.sm.smCount : g.rest.sm.smCount;
  return g.rc ? nullptr : (void *)(part ? g.part_s : g.rest_s);
}
#else
int main(int argc, char **argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "res") section_res();
  else if (mode == "launch") section_launch();
  else if (mode == "mem") section_mem();
  else if (mode == "event") section_event();
  else if (mode == "timing" && argc > 3) timing(argv[2], !strcmp(argv[3], "twoproc"));
  else {
    fprintf(stderr, "usage: green_probe res|launch|mem|event | timing CFG inproc|twoproc\n");
    return 2;
  }
  return 0;
}
#endif
#endif
