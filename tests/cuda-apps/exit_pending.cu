// Process exit with pending async work: a child process queues long work whose results go to a
// shared file mapping (registered as mapped host memory, written by kernels) and through a host
// function that writes into the same file, then returns from main at once, with no
// synchronization. The parent (which never initializes CUDA) checks the file: anything lost at
// exit (e.g. commands still buffered by an interposer) shows up as missing results.
#include "common.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static const int N = 1 << 16;
static const int CHAIN = 100;
// File layout: N ints written by kernels, then one int written by a host function.
static const size_t kBytes = (N + 1) * sizeof(int);

static void CUDART_CB host_marker(void *p) { *(volatile int *)p = 0x600d; }

static int child(const char *path) {
  int fd = open(path, O_RDWR);
  if (fd < 0) return 10;
  int *file = (int *)mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (file == MAP_FAILED) return 11;
  close(fd);
  cudaError_t r = cudaHostRegister(file, kBytes, cudaHostRegisterMapped);
  if (r != cudaSuccess) {
    fprintf(stderr, "cudaHostRegister of a shared file mapping: %s\n", cudaGetErrorString(r));
    return 12;
  }
  int *file_d;
  CK(cudaHostGetDevicePointer((void **)&file_d, file, 0));
  int *work;
  CK(cudaMalloc(&work, N * sizeof(int)));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  spin(s, 300.0);
  iota<<<blocks_for(N), 256, 0, s>>>(work, N, 7, 0);
  for (int i = 0; i < CHAIN; i++) add_all<<<blocks_for(N), 256, 0, s>>>(work, N, 1);
  affine<<<blocks_for(N), 256, 0, s>>>(work, file_d, N, 1, 0);  // file[i] = 7i + CHAIN
  CK(cudaLaunchHostFunc(s, host_marker, file + N));
  // Return at once: the runtime's exit path must not lose the queued work.
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0) return child(argv[2]);

  const char *dir = getenv("TMPDIR");
  char path[512];
  snprintf(path, sizeof path, "%s/exit_pending.%d", dir && *dir ? dir : "/tmp", (int)getpid());
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || ftruncate(fd, kBytes) != 0) {
    perror(path);
    return 3;
  }
  close(fd);
  for (int round = 0; round < 3; round++) {
    // zero the file
    fd = open(path, O_RDWR);
    std::vector<int> zero(N + 1, 0);
    if (pwrite(fd, zero.data(), kBytes, 0) != (ssize_t)kBytes) return 3;
    close(fd);
    double t0 = now_s();
    pid_t pid = fork();
    if (pid == 0) {
      execl("/proc/self/exe", argv[0], "--child", path, (char *)nullptr);
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    double took = now_s() - t0;
    char name[64];
    snprintf(name, sizeof name, "child_exited_cleanly_%d", round);
    check(WIFEXITED(status) && WEXITSTATUS(status) == 0, name, "status 0x%x", status);
    note("child %d took %.0f ms (the queued work alone is >= 300 ms)", round, took * 1e3);
    std::vector<int> v(N + 1);
    fd = open(path, O_RDONLY);
    if (pread(fd, v.data(), kBytes, 0) != (ssize_t)kBytes) return 3;
    close(fd);
    snprintf(name, sizeof name, "host_fn_ran_before_exit_%d", round);
    check(v[N] == 0x600d, name, "marker 0x%x", v[N]);
    v.resize(N);
    snprintf(name, sizeof name, "kernels_ran_before_exit_%d", round);
    expect_affine(v, 7, CHAIN, name);
    g_digest.add_vec(v);
  }
  unlink(path);
  return finish();
}
