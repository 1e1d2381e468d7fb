// Process exit with pending async work: a child process queues long work whose results go to
// shared memory (a memfd the parent created; registered as mapped host memory and written by
// kernels), plus a host function that writes a marker into the same memory, then returns from
// main at once, with no synchronization. The parent (which never initializes CUDA) checks the
// memory: anything lost at exit (e.g. commands still buffered by an interposer) shows up as
// missing results. If the driver refuses to register the memory, the child copies the results
// to pinned memory and a host function moves them over (a note on stderr says which path ran).
#include "common.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static const int N = 1 << 16;
static const int CHAIN = 100;
// Layout: N ints of results, then one int written by a host function.
static const size_t kBytes = (N + 1) * sizeof(int);

struct Marker {
  int *dst;           // shared memory
  const int *staged;  // pinned copy of the results (fallback path) or null
};

static void CUDART_CB host_marker(void *p) {
  Marker *m = static_cast<Marker *>(p);
  if (m->staged) memcpy(m->dst, m->staged, N * sizeof(int));
  *(volatile int *)(m->dst + N) = 0x600d;
}

static int child(int fd) {
  int *shared = (int *)mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (shared == MAP_FAILED) return 11;
  close(fd);
  // Register (or stage) first: only the queued work itself may be pending at exit.
  static Marker marker;
  marker.dst = shared;
  int *shared_d = nullptr, *staged = nullptr;
  cudaError_t r = cudaHostRegister(shared, kBytes, cudaHostRegisterMapped);
  if (r == cudaSuccess) {
    CK(cudaHostGetDevicePointer((void **)&shared_d, shared, 0));
    note("kernels write the shared memory directly");
  } else {
    (void)cudaGetLastError();
    CK(cudaMallocHost(&staged, N * sizeof(int)));
    note("cudaHostRegister of the shared memory: %s; results go through a host function", cudaGetErrorString(r));
  }
  int *work;
  CK(cudaMalloc(&work, N * sizeof(int)));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Load every kernel first (lazy module loading could otherwise wait for the spin below).
  spin(s, 0.0);
  iota<<<1, 1, 0, s>>>(work, 0, 0, 0);
  add_all<<<1, 1, 0, s>>>(work, 0, 0);
  affine<<<1, 1, 0, s>>>(work, work, 0, 0, 0);
  CK(cudaStreamSynchronize(s));
  spin(s, 300.0);
  iota<<<blocks_for(N), 256, 0, s>>>(work, N, 7, 0);
  for (int i = 0; i < CHAIN; i++) add_all<<<blocks_for(N), 256, 0, s>>>(work, N, 1);
  if (shared_d) {
    affine<<<blocks_for(N), 256, 0, s>>>(work, shared_d, N, 1, 0);  // shared[i] = 7i + CHAIN
  } else {
    CK(cudaMemcpyAsync(staged, work, N * sizeof(int), cudaMemcpyDeviceToHost, s));
    marker.staged = staged;
  }
  CK(cudaLaunchHostFunc(s, host_marker, &marker));
  // Return at once: the runtime's exit path must not lose the queued work.
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child-fd") == 0) return child(atoi(argv[2]));

  int fd = memfd_create("exit_pending", 0);  // inherited across exec (no MFD_CLOEXEC)
  if (fd < 0 || ftruncate(fd, kBytes) != 0) {
    perror("memfd");
    return 3;
  }
  int *shared = (int *)mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (shared == MAP_FAILED) return 3;
  char fdarg[16];
  snprintf(fdarg, sizeof fdarg, "%d", fd);
  for (int round = 0; round < 3; round++) {
    memset(shared, 0, kBytes);
    double t0 = now_s();
    pid_t pid = fork();
    if (pid == 0) {
      execl("/proc/self/exe", argv[0], "--child-fd", fdarg, (char *)nullptr);
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    double took = now_s() - t0;
    char name[64];
    snprintf(name, sizeof name, "child_exited_cleanly_%d", round);
    check(WIFEXITED(status) && WEXITSTATUS(status) == 0, name, "status 0x%x", status);
    note("child %d took %.0f ms (the queued work alone is >= 300 ms)", round, took * 1e3);
    std::vector<int> v(shared, shared + N + 1);
    snprintf(name, sizeof name, "host_fn_ran_before_exit_%d", round);
    check(v[N] == 0x600d, name, "marker 0x%x", v[N]);
    v.resize(N);
    snprintf(name, sizeof name, "kernels_ran_before_exit_%d", round);
    expect_affine(v, 7, CHAIN, name);
    g_digest.add_vec(v);
  }
  return finish();
}
