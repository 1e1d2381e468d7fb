// Green contexts on Hopper: what the driver allows. One JSON object per line.
// Usage: green_probe res|launch|mem|event — one section per process, so that a sticky error in
// one section cannot spoil the next:
//   res     resources, split granularity, green contexts and their streams
//   launch  which kernel handles launch on a green-context stream, and where their blocks run
//   mem     memory of either context used from the other
//   event   events across the primary and green contexts: ordering checked by results
// Built with -DGREEN_LIB instead, it is libgreen.so: green_stream() for green_torch.py and
// bench/pytorch/train.py. The timing experiment is green_timing.cu.
#include "green_common.cuh"

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

int main(int argc, char **argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "res") section_res();
  else if (mode == "launch") section_launch();
  else if (mode == "mem") section_mem();
  else if (mode == "event") section_event();
  else {
    fprintf(stderr, "usage: green_probe res|launch|mem|event\n");
    return 2;
  }
  return 0;
}
#endif  // GREEN_LIB
