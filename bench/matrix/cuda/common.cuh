// Shared pieces of the matrix's CUDA workloads (work.cu): options, the CLOCK_MONOTONIC clock that
// the Python workloads and the runner use too, ready/start files, the stop flag, progress marks,
// JSON output, and the one compute kernel every workload is made of.
#pragma once

#include <cuda_runtime.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#define CK(call)                                                                             \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(2);                                                                               \
    }                                                                                        \
  } while (0)

// The hash chain each block applies to its own word: a lost, repeated or reordered block changes
// the final value, so the host can check every block ran exactly once per launch, in order.
__host__ __device__ inline unsigned chain(unsigned v, unsigned launch, unsigned block) {
  return v * 2654435761u + (launch ^ block) + 1u;
}

// A block of real arithmetic: `iters` dependent FMAs per thread (the calibrated block length),
// then the block's word advances by one link of the chain. The never-true store keeps the loop.
__global__ void spin_work(unsigned *out, long long iters, unsigned launch) {
  float x = 1.0f + threadIdx.x * 1e-3f;
  for (long long i = 0; i < iters; i++) x = fmaf(x, 0.9999999f, 1e-7f);
  if (x == -1.0f) out[gridDim.x] = 0u;
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = chain(out[blockIdx.x], launch, blockIdx.x);
}

inline double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // the clock of time.monotonic(): windows compare
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

inline void sleep_s(double s) {
  if (s > 0) usleep((useconds_t)(s * 1e6));
}

static volatile sig_atomic_t g_stop = 0;
inline void on_signal(int) { g_stop = 1; }
inline void install_stop() {
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
}

// --key value options; every option a mode reads must be named in its `known` list, so a typo in
// a scenario fails loudly instead of running with a default.
struct Opts {
  std::map<std::string, std::vector<std::string>> kv;
  bool parse(int argc, char **argv, int first, const std::vector<std::string> &known, const std::vector<std::string> &flags) {
    for (int i = first; i < argc; i++) {
      std::string k = argv[i];
      if (k.rfind("--", 0) != 0) return fail("unexpected argument " + k);
      k = k.substr(2);
      if (std::find(flags.begin(), flags.end(), k) != flags.end()) {
        kv[k].push_back("1");
        continue;
      }
      if (std::find(known.begin(), known.end(), k) == known.end()) return fail("unknown option --" + k);
      if (i + 1 >= argc) return fail("--" + k + " needs a value");
      kv[k].push_back(argv[++i]);
    }
    return true;
  }
  bool fail(const std::string &m) {
    fprintf(stderr, "work: %s\n", m.c_str());
    return false;
  }
  bool has(const std::string &k) const { return kv.count(k) > 0; }
  double num(const std::string &k, double d) const { return has(k) ? atof(kv.at(k).back().c_str()) : d; }
  std::string str(const std::string &k, const std::string &d = "") const { return has(k) ? kv.at(k).back() : d; }
  std::vector<std::string> all(const std::string &k) const { return has(k) ? kv.at(k) : std::vector<std::string>(); }
};

// The options every workload takes, beside its own.
inline std::vector<std::string> common_opts(std::vector<std::string> own) {
  for (const char *k : {"duration", "seed", "ready-file", "start-after", "out", "tag", "ipu-light", "ipu-full", "sms"}) own.push_back(k);
  return own;
}

inline void touch(const std::string &path) {
  if (path.empty()) return;
  std::string tmp = path + ".tmp";
  if (FILE *f = fopen(tmp.c_str(), "w")) {
    fprintf(f, "%.6f", now_s());
    fclose(f);
    rename(tmp.c_str(), path.c_str());
  }
}

inline bool wait_files(const std::vector<std::string> &paths, double timeout_s = 900) {
  double t0 = now_s();
  for (;;) {
    bool all = true;
    for (auto &p : paths) all = all && access(p.c_str(), F_OK) == 0;
    if (all) return true;
    if (g_stop || now_s() - t0 > timeout_s) return false;
    usleep(2000);
  }
}

// Cumulative work done at CLOCK_MONOTONIC times, at most one mark per `gap_s`, so the runner can
// compute the throughput inside any window (the latency-critical job's) by interpolation.
struct Marks {
  std::vector<double> t, work;
  double gap_s = 0.002;
  void add(double when, double done, bool force = false) {
    if (force || t.empty() || when - t.back() >= gap_s) {
      t.push_back(when);
      work.push_back(done);
    }
  }
};

// A JSON object built field by field (no library on the device machines).
struct Json {
  std::string s = "{";
  void key(const char *k) {
    if (s.size() > 1) s += ", ";
    s += "\"";
    s += k;
    s += "\": ";
  }
  Json &num(const char *k, double v) {
    key(k);
    char b[64];
    if (std::isfinite(v))
      snprintf(b, sizeof b, "%.9g", v);
    else
      snprintf(b, sizeof b, "null");
    s += b;
    return *this;
  }
  Json &str(const char *k, const std::string &v) {
    key(k);
    s += "\"";
    for (char c : v) {
      if (c == '"' || c == '\\') s += '\\';
      if ((unsigned char)c >= 0x20) s += c;
    }
    s += "\"";
    return *this;
  }
  Json &boolean(const char *k, bool v) {
    key(k);
    s += v ? "true" : "false";
    return *this;
  }
  Json &list(const char *k, const std::vector<double> &v, int decimals) {
    key(k);
    s += "[";
    char b[64];
    for (size_t i = 0; i < v.size(); i++) {
      snprintf(b, sizeof b, "%s%.*f", i ? ", " : "", decimals, v[i]);
      s += b;
    }
    s += "]";
    return *this;
  }
  std::string done() const { return s + "}"; }
};

// Prints the result as one line and writes it to --out (atomically: the runner may be reading).
inline void emit(const Opts &o, Json &j) {
  j.str("tag", o.str("tag"));
  std::string text = j.done();
  printf("%s\n", text.c_str());
  fflush(stdout);
  std::string out = o.str("out");
  if (!out.empty()) {
    std::string tmp = out + ".tmp";
    if (FILE *f = fopen(tmp.c_str(), "w")) {
      fprintf(f, "%s\n", text.c_str());
      fclose(f);
      rename(tmp.c_str(), out.c_str());
    }
  }
}

// FNV-1a over 32-bit words, as a hex string.
inline std::string fnv_hex(const unsigned *w, size_t n, unsigned long long h = 1469598103934665603ull) {
  for (size_t i = 0; i < n; i++) {
    h ^= w[i];
    h *= 1099511628211ull;
  }
  char b[32];
  snprintf(b, sizeof b, "%016llx", h);
  return b;
}

// `--sms N` (the runner passes the device's count, calibrated alone): grids sized for the whole
// device. Under MPS with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE a client sees only its share of the
// SMs, and a job sized by that would do less work per kernel than alone.
inline int &sms_given() {
  static int n = 0;
  return n;
}

inline int sm_count() {
  if (sms_given() > 0) return sms_given();
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

// Blocks of `threads` threads of `kernel` (spin_work by default) resident per SM at once.
template <typename Kernel>
inline int resident_per_sm(int threads, Kernel kernel) {
  int n = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0));
  return std::max(1, n);
}
inline int resident_per_sm(int threads) { return resident_per_sm(threads, spin_work); }

inline std::string device_name() {
  int dev = 0;
  cudaDeviceProp p;
  CK(cudaGetDevice(&dev));
  CK(cudaGetDeviceProperties(&p, dev));
  return p.name;
}
