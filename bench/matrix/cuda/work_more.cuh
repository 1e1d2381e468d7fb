// work.cu's persistent and copy/compute-overlap workloads (included by work.cu after its helpers).
#pragma once

// One resident grid that loops over ITEMS items (grid-stride), each ~item_us of arithmetic; each
// block publishes how many items it finished through host-mapped memory, as persistent kernels
// report progress without ending.
__global__ void persistent_work(unsigned *out, long long iters, unsigned items, unsigned launch,
                                volatile unsigned long long *progress) {
  for (unsigned it = blockIdx.x; it < items; it += gridDim.x) {
    float x = 1.0f + threadIdx.x * 1e-3f;
    for (long long i = 0; i < iters; i++) x = fmaf(x, 0.9999999f, 1e-7f);
    if (x == -1.0f) out[items] = 0u;
    __syncthreads();
    if (threadIdx.x == 0) {
      out[it] = chain(out[it], launch, it);
      progress[blockIdx.x] = progress[blockIdx.x] + 1;
      __threadfence_system();
    }
  }
}

static int persistent(const Opts &o) {
  double light, full;
  std::string src;
  ipus(o, light, full, src);
  // Every block resident at once: the grid is one wave of this kernel, as persistent kernels are.
  const int threads = 256, grid = sm_count() * resident_per_sm(threads, persistent_work);
  const double item_us = o.num("item-us", 50), launch_ms = o.num("launch-ms", 200), duration = o.num("duration", 600);
  const long long check = (long long)o.num("check-launches", 1);
  const unsigned items = (unsigned)grid * (unsigned)std::max(1LL, llround(launch_ms * 1e3 / item_us));
  const long long iters = iters_for(item_us, full);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned *out;
  CK(cudaMalloc(&out, sizeof(unsigned) * (items + 1)));
  CK(cudaMemset(out, 0, sizeof(unsigned) * (items + 1)));
  unsigned long long *progress_host, *progress_dev;
  CK(cudaHostAlloc(&progress_host, sizeof(unsigned long long) * grid, cudaHostAllocMapped));
  memset(progress_host, 0, sizeof(unsigned long long) * grid);
  CK(cudaHostGetDevicePointer(&progress_dev, progress_host, 0));
  std::vector<unsigned> snap(items);
  cudaEvent_t ev, ta, tb;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CK(cudaEventCreate(&ta));
  CK(cudaEventCreate(&tb));
  auto items_done = [&]() {
    unsigned long long n = 0;
    for (int b = 0; b < grid; b++) n += ((volatile unsigned long long *)progress_host)[b];
    return (double)n;
  };
  Marks marks;
  marks.gap_s = 0.005;
  long long launches = 0;
  double t_ready = NAN, launch_ms_measured = NAN;
  std::string checksum;
  const double t_begin = now_s();
  while ((!g_stop || launches < check) && now_s() - t_begin < duration) {
    CK(cudaEventRecord(ta, s));
    persistent_work<<<grid, threads, 0, s>>>(out, iters, items, (unsigned)launches, progress_dev);
    CK(cudaGetLastError());
    CK(cudaEventRecord(tb, s));
    CK(cudaEventRecord(ev, s));
    cudaError_t q;
    while ((q = cudaEventQuery(ev)) == cudaErrorNotReady) {
      marks.add(now_s(), items_done());
      usleep(1000);
    }
    CK(q);
    launches++;
    marks.add(now_s(), (double)launches * items, true);
    if (launches == 1) {
      float ms;
      CK(cudaEventElapsedTime(&ms, ta, tb));
      launch_ms_measured = ms;
      t_ready = now_s();
      touch(o.str("ready-file"));
    }
    if (launches == check) {
      CK(cudaMemcpy(snap.data(), out, sizeof(unsigned) * items, cudaMemcpyDeviceToHost));
      checksum = fnv_hex(snap.data(), items);
    }
  }
  const double t_stop = now_s();
  CK(cudaMemcpy(snap.data(), out, sizeof(unsigned) * items, cudaMemcpyDeviceToHost));
  const bool exact = all_exact(snap, (int)items, launches) && items_done() == (double)launches * items;
  Json j;
  j.str("program", "work-persistent").str("device", device_name()).str("ipu_source", src);
  j.num("grid", grid).num("items_per_launch", items).num("item_us", item_us).num("launch_ms", launch_ms);
  j.num("launch_ms_measured", launch_ms_measured).num("launches", (double)launches).num("iters", (double)iters);
  j.num("t_ready", t_ready).num("t_stop", t_stop).str("unit", "items");
  j.num("check_launches", (double)check).str("checksum", checksum).boolean("exact", exact);
  j.list("mark_t", marks.t, 6).list("mark_work", marks.work, 0);
  emit(o, j);
  return exact ? 0 : 1;
}

// The compute of one chunk: ELEM_ITERS dependent FMAs per element, seeded by the element and the
// chunk number (grid-stride over the chunk).
__global__ void chunk_work(const float *in, float *out, size_t n, int elem_iters, unsigned chunk) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float x = in[i] + (float)(chunk & 1023) * 1e-3f;
    for (int k = 0; k < elem_iters; k++) x = fmaf(x, 0.999f, 1e-3f);
    out[i] = x;
  }
}

static int overlap(const Opts &o) {
  const int streams = std::max(1, (int)o.num("streams", 4));
  const size_t n = (size_t)(o.num("chunk-mb", 8) * (1 << 20) / sizeof(float));
  const int elem_iters = (int)o.num("elem-iters", 2048);
  const long long check = (long long)o.num("check-chunks", 16), warm = (long long)o.num("warmup-chunks", 8);
  const double duration = o.num("duration", 600);
  const int variants = 4;  // distinct input chunks, filled from the seed
  std::vector<float *> hin(variants);
  std::mt19937 rng((unsigned)o.num("seed", 1));
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (auto &h : hin) {
    CK(cudaMallocHost(&h, n * sizeof(float)));
    for (size_t i = 0; i < n; i++) h[i] = uni(rng);
  }
  std::vector<cudaStream_t> st(streams);
  std::vector<float *> din(streams), dout(streams), hout(streams);
  std::vector<cudaEvent_t> ev(streams);
  std::vector<long long> slot_chunk(streams, -1);
  for (int i = 0; i < streams; i++) {
    CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
    CK(cudaMalloc(&din[i], n * sizeof(float)));
    CK(cudaMalloc(&dout[i], n * sizeof(float)));
    CK(cudaMallocHost(&hout[i], n * sizeof(float)));
    CK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
  }
  const int grid = sm_count() * 4;
  // The checksum folds every 61st word of each of the first CHECK chunks, in chunk order (the
  // host must not become the bottleneck of a copy/compute pipeline).
  unsigned long long fold = 1469598103934665603ull;
  long long issued = 0, finished = 0;
  Marks marks;
  double t_ready = NAN;
  auto retire = [&](int i) {
    CK(cudaEventSynchronize(ev[i]));
    if (slot_chunk[i] >= 0 && slot_chunk[i] < check) {
      const unsigned *w = (const unsigned *)hout[i];
      for (size_t k = 0; k < n; k += 61) fold = (fold ^ w[k]) * 1099511628211ull;
    }
    if (slot_chunk[i] >= 0) finished++;
    slot_chunk[i] = -1;
  };
  const double t_begin = now_s();
  while ((!g_stop || issued < check) && now_s() - t_begin < duration) {
    const int i = (int)(issued % streams);
    retire(i);  // chunks retire in issue order: the fold is deterministic
    CK(cudaMemcpyAsync(din[i], hin[issued % variants], n * sizeof(float), cudaMemcpyHostToDevice, st[i]));
    chunk_work<<<grid, 256, 0, st[i]>>>(din[i], dout[i], n, elem_iters, (unsigned)issued);
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(hout[i], dout[i], n * sizeof(float), cudaMemcpyDeviceToHost, st[i]));
    CK(cudaEventRecord(ev[i], st[i]));
    slot_chunk[i] = issued++;
    marks.add(now_s(), (double)finished);
    if (std::isnan(t_ready) && finished >= warm) {
      t_ready = now_s();
      touch(o.str("ready-file"));
    }
  }
  for (long long k = 0; k < streams; k++) retire((int)((issued + k) % streams));
  const double t_stop = now_s();
  marks.add(t_stop, (double)finished, true);
  char sum[32];
  snprintf(sum, sizeof sum, "%016llx", fold);
  Json j;
  j.str("program", "work-overlap").str("device", device_name());
  j.num("streams", streams).num("chunk_mb", o.num("chunk-mb", 8)).num("elem_iters", elem_iters);
  j.num("chunks", (double)finished).num("t_ready", t_ready).num("t_stop", t_stop).str("unit", "chunks");
  j.num("check_chunks", (double)check).str("checksum", sum).boolean("exact", finished == issued);
  j.list("mark_t", marks.t, 6).list("mark_work", marks.work, 0);
  emit(o, j);
  return 0;
}
