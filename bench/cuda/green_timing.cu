// Green contexts on Hopper: what SM confinement buys. LC requests against a
// GPU-filling BE spin workload; prints one JSON object.
// Usage: green_timing CFG inproc|twoproc
//   CFG: lc_alone be_alone prio conf<F> split<F> switch<F>_h<HOLD_US>, F = SMs kept free of BE:
//     prio    BE on a full-device stream at the lowest priority, LC at the highest
//     conf    BE always on a green context of all SMs but F, LC unconfined
//     split   conf, and LC on a green context of the F SMs
//     switch  BE launched on the full-device stream while LC is idle and on the green stream
//             while an LC request runs or ended less than HOLD_US ago; the switch is an event
//             recorded on the stream left and waited on by the stream taken
//   inproc: BE and LC are threads of one process; twoproc: BE is a forked child (run it under MPS).
//   Knobs: BE_US BE_WAVES BE_DEPTH LC_US LC_GRID LC_KERNELS LC_N LC_GAP_US PATTERN=poisson|burst.
#include "green_common.cuh"

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
  // enough to delay other work: docs/results/h100-green-contexts.md) and read with a
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

int main(int argc, char **argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 3) {
    fprintf(stderr, "usage: green_timing CFG inproc|twoproc\n");
    return 2;
  }
  timing(argv[1], !strcmp(argv[2], "twoproc"));
  return 0;
}
