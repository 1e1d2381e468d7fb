// Shared helpers of the CUDA conformance programs: error checks, self-checks, a deterministic
// digest of result buffers, and time-based spin kernels.
//
// Output contract (run.sh relies on it): stdout holds only deterministic lines ("CHECK <name> ok"
// and a last "DIGEST <16 hex>"), so a run under the shim can be compared bit for bit with a native
// run; timing notes go to stderr. Exit status 0 iff every check passed.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(call)                                                                             \
  do {                                                                                       \
    cudaError_t err_ = (call);                                                               \
    if (err_ != cudaSuccess) {                                                               \
      fprintf(stderr, "%s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #call,                  \
              cudaGetErrorName(err_), cudaGetErrorString(err_));                             \
      exit(2);                                                                               \
    }                                                                                        \
  } while (0)

// Failed checks are counted, not fatal, so one run reports every broken semantic.
static int g_failures = 0;

static void check(bool ok, const char *name, const char *fmt = nullptr, ...) {
  if (ok) {
    printf("CHECK %s ok\n", name);
  } else {
    g_failures++;
    printf("CHECK %s FAIL\n", name);
    if (fmt) {
      va_list ap;
      va_start(ap, fmt);
      fprintf(stderr, "  %s: ", name);
      vfprintf(stderr, fmt, ap);
      fprintf(stderr, "\n");
      va_end(ap);
    }
  }
  fflush(stdout);
}

// Informational lines (timing-dependent observations) never enter stdout.
static void note(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "note: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

// FNV-1a, 64 bit, over everything the program's results consist of.
struct Digest {
  uint64_t h = 1469598103934665603ull;
  void add(const void *p, size_t n) {
    const unsigned char *b = static_cast<const unsigned char *>(p);
    for (size_t i = 0; i < n; i++) {
      h ^= b[i];
      h *= 1099511628211ull;
    }
  }
  template <typename T> void add_vec(const std::vector<T> &v) { add(v.data(), v.size() * sizeof(T)); }
  void add_u64(uint64_t v) { add(&v, sizeof v); }
};

static Digest g_digest;

// Prints the digest and returns the exit status: call as `return finish();` at the end of main.
static int finish() {
  printf("DIGEST %016llx\n", (unsigned long long)g_digest.h);
  fflush(stdout);
  if (g_failures) fprintf(stderr, "%d check(s) failed\n", g_failures);
  return g_failures ? 1 : 0;
}

static double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

__device__ __forceinline__ uint64_t gtimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One thread spins for `ns` nanoseconds of wall time, then (optionally) writes `value` to `*out`.
// Wall time, not cycles: the work is "long" whatever the clock or time slice.
__global__ void spin_then_write(unsigned long long ns, int *out, int value) {
  uint64_t t0 = gtimer_ns();
  while (gtimer_ns() - t0 < ns) {
  }
  if (out) {
    *(volatile int *)out = value;
    __threadfence_system();
  }
}

// out[i] = in[i] * mul + add (in may equal out).
__global__ void affine(const int *in, int *out, int n, int mul, int add) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * mul + add;
}

// buf[i] = i * mul + add
__global__ void iota(int *buf, int n, int mul, int add) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) buf[i] = i * mul + add;
}

// buf[i] += delta
__global__ void add_all(int *buf, int n, int delta) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) buf[i] += delta;
}

static inline int blocks_for(int n, int t = 256) { return (n + t - 1) / t; }

static void spin(cudaStream_t s, double ms, int *out = nullptr, int value = 0) {
  spin_then_write<<<1, 1, 0, s>>>((unsigned long long)(ms * 1e6), out, value);
  CK(cudaGetLastError());
}

// Host memory the GPU can write directly (pinned + mapped); returns the host pointer and, through
// dev, the device pointer.
template <typename T> static T *mapped_alloc(size_t n, T **dev) {
  T *h = nullptr;
  CK(cudaHostAlloc((void **)&h, n * sizeof(T), cudaHostAllocMapped | cudaHostAllocPortable));
  memset(h, 0, n * sizeof(T));
  CK(cudaHostGetDevicePointer((void **)dev, h, 0));
  return h;
}

static std::vector<int> to_host(const int *d, int n) {
  std::vector<int> v(n);
  CK(cudaMemcpy(v.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
  return v;
}

// Checks v[i] == i * mul + add for all i; names the first mismatch.
static bool expect_affine(const std::vector<int> &v, int mul, int add, const char *name) {
  for (size_t i = 0; i < v.size(); i++) {
    int want = (int)i * mul + add;
    if (v[i] != want) {
      check(false, name, "element %zu is %d, expected %d", i, v[i], want);
      return false;
    }
  }
  check(true, name);
  return true;
}
