// The matrix's CUDA C++ workloads, one program with one mode per workload (README.md beside it):
//
//   work calibrate                       iterations of spin_work per µs of block time, for a light
//                                        wave (one 128-thread block per SM) and a full one (every
//                                        resident 256-thread block); the runner runs it once, alone,
//                                        and passes the numbers to every job so block lengths are
//                                        the same in every run
//   work lc   [--kernels 10 --block-us 20 --rate R | --util U | --closed] [--arrival-seed N] [--graph]
//                                        latency-critical requests: KERNELS one-wave kernels of
//                                        BLOCK_US blocks (with --graph, one CUDA graph of them),
//                                        then a stream synchronize
//   work be   [--kernel-ms 4 --block-us 100 --streams 1 --in-flight 8]
//                                        best effort: kernels of KERNEL_MS made of BLOCK_US blocks,
//                                        on STREAMS streams that together fill one wave
//   work persistent [--item-us 50 --launch-ms 200]
//                                        one resident grid looping over items (grid-stride), each
//                                        launch ~LAUNCH_MS, progress read through mapped memory
//   work overlap [--streams 4 --chunk-mb 8 --elem-iters 2048]
//                                        copy/compute overlap: per chunk H2D, a kernel, D2H, chunks
//                                        spread over STREAMS streams
//
// Every mode takes --duration --seed --ready-file --start-after (repeatable) --out --tag, prints
// one JSON line at the end (also written to --out), times on CLOCK_MONOTONIC, and checks its
// results: every block's hash chain is verified on the host (`exact`), and a checksum of the
// state after a fixed amount of work is compared across runs by the runner.
#include "common.cuh"

#include <random>

static long long iters_for(double block_us, double ipu) { return std::max(1LL, (long long)llround(block_us * ipu)); }

// Time of one launch of `grid` x `threads` blocks of `iters`, the fastest of 5 (ms).
static double time_wave(int grid, int threads, long long iters) {
  unsigned *out;
  CK(cudaMalloc(&out, sizeof(unsigned) * (grid + 1)));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int i = 0; i < 7; i++) {
    CK(cudaEventRecord(a));
    spin_work<<<grid, threads>>>(out, iters, i);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 2) best = std::min(best, ms);
  }
  CK(cudaFree(out));
  return best;
}

static void calibrate_ipu(double &light, double &full) {
  const long long iters = 200000;
  int sms = sm_count();
  light = iters / (time_wave(sms, 128, iters) * 1e3);
  full = iters / (time_wave(sms * resident_per_sm(256), 256, iters) * 1e3);
}

// --ipu-light/--ipu-full from the runner; a program started by hand calibrates itself.
static void ipus(const Opts &o, double &light, double &full, std::string &source) {
  if (o.has("ipu-light") && o.has("ipu-full")) {
    light = o.num("ipu-light", 0), full = o.num("ipu-full", 0), source = "given";
  } else {
    calibrate_ipu(light, full), source = "self";
  }
}

static int calibrate(const Opts &o) {
  double light, full;
  calibrate_ipu(light, full);
  Json j;
  j.str("program", "work-calibrate").str("device", device_name()).num("sms", sm_count());
  j.num("resident_per_sm_256", resident_per_sm(256)).num("ipu_light", light).num("ipu_full", full);
  emit(o, j);
  return 0;
}

// Expected hash-chain word of `block` after `launches` launches numbered from 0 (or, with a
// period, numbered 0..period-1 over and over: a replayed graph's kernels keep their arguments).
static unsigned expect(unsigned block, long long launches, long long period = 0) {
  unsigned v = 0;
  for (long long k = 0; k < launches; k++) v = chain(v, (unsigned)(period ? k % period : k), block);
  return v;
}

static bool all_exact(const std::vector<unsigned> &got, int blocks, long long launches, long long period = 0) {
  for (int b = 0; b < blocks; b++)
    if (got[b] != expect(b, launches, period)) return false;
  return true;
}

static int lc(const Opts &o) {
  double light, full;
  std::string src;
  ipus(o, light, full, src);
  const int kernels = (int)o.num("kernels", 10), sms = sm_count();
  const int blocks = (int)o.num("blocks", sms), threads = 128;
  const double block_us = o.num("block-us", 20), duration = o.num("duration", 5);
  const long long iters = iters_for(block_us, light);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned *out;
  CK(cudaMalloc(&out, sizeof(unsigned) * (blocks + 1)));
  CK(cudaMemset(out, 0, sizeof(unsigned) * (blocks + 1)));
  long long launched = 0;
  // --graph: the request's kernels captured once into a CUDA graph and replayed (one launch per
  // request), their launch numbers fixed at 0..kernels-1.
  const bool use_graph = o.has("graph");
  cudaGraphExec_t exec = nullptr;
  if (use_graph) {
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int k = 0; k < kernels; k++) spin_work<<<blocks, threads, 0, s>>>(out, iters, (unsigned)k);
    CK(cudaStreamEndCapture(s, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphDestroy(graph));
  }
  auto launch_request = [&]() {
    if (use_graph) {
      CK(cudaGraphLaunch(exec, s));
      launched += kernels;
    } else {
      for (int k = 0; k < kernels; k++) spin_work<<<blocks, threads, 0, s>>>(out, iters, (unsigned)launched++);
    }
    CK(cudaGetLastError());
  };
  auto request = [&]() {
    launch_request();
    CK(cudaStreamSynchronize(s));
  };
  for (int i = 0; i < (int)o.num("warmup", 50); i++) request();
  // Calibration: the wall time of a request (service) and its GPU span (events around its kernels).
  cudaEvent_t ea, eb;
  CK(cudaEventCreate(&ea));
  CK(cudaEventCreate(&eb));
  std::vector<double> svc, gpu;
  for (int i = 0; i < (int)o.num("calib", 200); i++) {
    double t0 = now_s();
    CK(cudaEventRecord(ea, s));
    launch_request();
    CK(cudaEventRecord(eb, s));
    CK(cudaStreamSynchronize(s));
    svc.push_back(now_s() - t0);
    float ms;
    CK(cudaEventElapsedTime(&ms, ea, eb));
    gpu.push_back(ms * 1e-3);
  }
  std::sort(svc.begin(), svc.end());
  std::sort(gpu.begin(), gpu.end());
  const double service = svc[svc.size() / 2], gpu_span = gpu[gpu.size() / 2];
  const bool closed = o.has("closed");
  const double rate = o.has("rate") ? o.num("rate", 0) : o.num("util", 0.3) / service;
  std::vector<unsigned> got(blocks);
  CK(cudaMemcpy(got.data(), out, sizeof(unsigned) * blocks, cudaMemcpyDeviceToHost));
  const std::string digest = fnv_hex(got.data(), blocks);
  touch(o.str("ready-file"));
  wait_files(o.all("start-after"));

  std::mt19937_64 rng((unsigned long long)o.num("arrival-seed", o.num("seed", 1)));
  std::exponential_distribution<double> gap(closed ? 1.0 : rate);
  std::vector<double> lat, ser;
  const double t_start = now_s(), end = t_start + duration;
  double arrival = closed ? t_start : t_start + gap(rng);
  while (arrival < end && !g_stop) {
    double wait = arrival - now_s();
    if (wait > 0.0005) sleep_s(wait - 0.0003);
    while (now_s() < arrival) {
    }
    double begin = now_s();
    request();
    double done = now_s();
    lat.push_back((done - arrival) * 1e3);
    ser.push_back((done - begin) * 1e3);
    arrival = closed ? done : arrival + gap(rng);
  }
  const double t_end = now_s(), wall = t_end - t_start;
  CK(cudaMemcpy(got.data(), out, sizeof(unsigned) * blocks, cudaMemcpyDeviceToHost));
  Json j;
  j.str("program", "work-lc").str("device", device_name()).str("ipu_source", src);
  j.num("kernels_per_request", kernels).num("blocks", blocks).num("block_us", block_us).num("iters", (double)iters);
  j.num("service_calib_ms", service * 1e3).num("gpu_calib_ms", gpu_span * 1e3).num("rate_per_s", closed ? NAN : rate);
  j.boolean("closed_loop", closed).num("t_start", t_start).num("t_end", t_end).num("wall_s", wall);
  j.boolean("stopped_early", g_stop != 0).num("count", (double)lat.size());
  j.num("u", wall > 0 ? lat.size() * service / wall : NAN).num("u_gpu", wall > 0 ? lat.size() * gpu_span / wall : NAN);
  j.boolean("graph", use_graph).str("output_sha256", digest);
  j.boolean("exact", all_exact(got, blocks, launched, use_graph ? kernels : 0));
  j.list("latencies_ms", lat, 4).list("services_ms", ser, 4);
  emit(o, j);
  return 0;
}

static int be(const Opts &o) {
  double light, full;
  std::string src;
  ipus(o, light, full, src);
  const int streams = std::max(1, (int)o.num("streams", 1)), in_flight = std::max(1, (int)o.num("in-flight", 8));
  const double block_us = o.num("block-us", 100), kernel_ms = o.num("kernel-ms", 4), duration = o.num("duration", 600);
  const long long check = (long long)o.num("check-kernels", 20), warm = (long long)o.num("warmup-kernels", 10);
  const int threads = 256, sms = sm_count();
  // The streams' kernels together fill one wave of resident blocks; each is WAVES waves long.
  const int per_wave = std::max(1, sms * resident_per_sm(threads) / streams);
  const int waves = std::max(1, (int)llround(kernel_ms * 1e3 / block_us));
  const int blocks = per_wave * waves;
  const long long iters = iters_for(block_us, full);
  std::vector<cudaStream_t> st(streams);
  std::vector<unsigned *> out(streams);
  std::vector<unsigned *> snap(streams);
  std::vector<std::vector<cudaEvent_t>> ev(streams, std::vector<cudaEvent_t>(in_flight));
  std::vector<long long> launched(streams, 0), done(streams, 0);
  for (int i = 0; i < streams; i++) {
    CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
    CK(cudaMalloc(&out[i], sizeof(unsigned) * (blocks + 1)));
    CK(cudaMemset(out[i], 0, sizeof(unsigned) * (blocks + 1)));
    CK(cudaMallocHost(&snap[i], sizeof(unsigned) * blocks));
    for (auto &e : ev[i]) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  CK(cudaDeviceSynchronize());
  // One kernel timed alone before anything else runs (startup: the other jobs are not measuring).
  cudaEvent_t ta, tb;
  CK(cudaEventCreate(&ta));
  CK(cudaEventCreate(&tb));
  Marks marks;
  bool ready = false;
  double t_ready = NAN, kernel_ms_measured = NAN;
  const double t_begin = now_s();
  auto total_done = [&]() {
    long long n = 0;
    for (long long d : done) n += d;
    return n;
  };
  auto short_of_check = [&]() {
    for (long long l : launched)
      if (l < check) return true;
    return false;
  };
  // A stop request still lets every stream reach its checksum point, as train.py does.
  while ((!g_stop || short_of_check()) && now_s() - t_begin < duration) {
    for (int i = 0; i < streams; i++) {
      cudaEvent_t &slot = ev[i][launched[i] % in_flight];
      if (launched[i] >= in_flight) {
        CK(cudaEventSynchronize(slot));
        done[i] = launched[i] - in_flight + 1;
      }
      const bool timed = i == 0 && launched[0] == 2;
      if (timed) CK(cudaEventRecord(ta, st[i]));
      spin_work<<<blocks, threads, 0, st[i]>>>(out[i], iters, (unsigned)launched[i]);
      CK(cudaGetLastError());
      if (timed) CK(cudaEventRecord(tb, st[i]));
      if (++launched[i] == check) CK(cudaMemcpyAsync(snap[i], out[i], sizeof(unsigned) * blocks, cudaMemcpyDeviceToHost, st[i]));
      CK(cudaEventRecord(slot, st[i]));
    }
    const double t = now_s();
    marks.add(t, (double)total_done());
    if (!ready && total_done() >= warm * streams) {
      ready = true, t_ready = t;
      touch(o.str("ready-file"));
    }
  }
  CK(cudaDeviceSynchronize());
  const double t_stop = now_s();
  for (int i = 0; i < streams; i++) done[i] = launched[i];
  marks.add(t_stop, (double)total_done(), true);
  if (launched[0] > 2) {
    float ms;
    CK(cudaEventElapsedTime(&ms, ta, tb));
    kernel_ms_measured = ms;
  }
  bool exact = true;
  std::string sum;
  std::vector<unsigned> got(blocks);
  for (int i = 0; i < streams; i++) {
    CK(cudaMemcpy(got.data(), out[i], sizeof(unsigned) * blocks, cudaMemcpyDeviceToHost));
    exact = exact && all_exact(got, blocks, launched[i]);
    sum += fnv_hex(snap[i], blocks);
  }
  const std::vector<unsigned> joined(sum.begin(), sum.end());
  Json j;
  j.str("program", "work-be").str("device", device_name()).str("ipu_source", src);
  j.num("streams", streams).num("in_flight", in_flight).num("blocks", blocks).num("waves", waves);
  j.num("block_us", block_us).num("kernel_ms", kernel_ms).num("kernel_ms_measured", kernel_ms_measured).num("iters", (double)iters);
  j.num("kernels", (double)total_done()).num("t_ready", t_ready).num("t_stop", t_stop).str("unit", "kernels");
  j.num("check_kernels", (double)check).str("checksum", fnv_hex(joined.data(), joined.size())).boolean("exact", exact);
  j.list("mark_t", marks.t, 6).list("mark_work", marks.work, 0);
  emit(o, j);
  return exact ? 0 : 1;
}

#include "work_more.cuh"

// Parses the options and takes in --sms.
static bool parsed(Opts &o, int argc, char **argv, std::vector<std::string> opts, std::vector<std::string> flags) {
  if (!o.parse(argc, argv, 2, opts, flags)) return false;
  sms_given() = (int)o.num("sms", 0);
  return true;
}

int main(int argc, char **argv) {
  install_stop();
  if (argc < 2) {
    fprintf(stderr, "usage: work calibrate|lc|be|persistent|overlap [--option value ...]\n");
    return 2;
  }
  const std::string mode = argv[1];
  Opts o;
  if (mode == "calibrate") return parsed(o, argc, argv, common_opts({}), {}) ? calibrate(o) : 2;
  if (mode == "lc")
    return parsed(o, argc, argv, common_opts({"kernels", "blocks", "block-us", "rate", "util", "warmup", "calib", "arrival-seed"}), {"closed", "graph"}) ? lc(o) : 2;
  if (mode == "be")
    return parsed(o, argc, argv, common_opts({"kernel-ms", "block-us", "streams", "in-flight", "check-kernels", "warmup-kernels"}), {})
               ? be(o)
               : 2;
  if (mode == "persistent")
    return parsed(o, argc, argv, common_opts({"item-us", "launch-ms", "check-launches"}), {}) ? persistent(o) : 2;
  if (mode == "overlap")
    return parsed(o, argc, argv, common_opts({"streams", "chunk-mb", "elem-iters", "check-chunks", "warmup-chunks"}), {}) ? overlap(o) : 2;
  fprintf(stderr, "work: unknown mode %s\n", mode.c_str());
  return 2;
}
