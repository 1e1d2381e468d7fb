// fork() after CUDA is initialized and while work is queued and another thread is launching:
// the child must not use CUDA but must be able to run ordinary code (malloc, stdio, threads) and
// exit both ways (_exit, as Python's multiprocessing does, and exit(), which runs atexit
// handlers); the parent's queued work and later work are unaffected.
#include "common.h"

#include <atomic>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

static const int N = 1 << 16;

// CPU-only work in the child: checksum of a host copy made before the fork.
static int child_main(const std::vector<int> &snapshot, int wfd, bool use_exit) {
  std::thread th([&] {
    uint64_t h = 0;
    for (int x : snapshot) h = h * 31 + (unsigned)x;
    std::vector<char> junk(1 << 20, 1);  // malloc in the child
    h += junk[12345];
    if (write(wfd, &h, sizeof h) != (ssize_t)sizeof h) _exit(5);
  });
  th.join();
  close(wfd);
  if (use_exit) exit(0);
  _exit(0);
}

int main() {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int *a;
  CK(cudaMalloc(&a, N * sizeof(int)));
  iota<<<blocks_for(N), 256, 0, s>>>(a, N, 3, 1);
  std::vector<int> snapshot = to_host(a, N);
  CK(cudaStreamSynchronize(s));

  // A second thread keeps launching on its own stream throughout the forks.
  std::atomic<bool> stop{false};
  std::atomic<long> launched{0};
  int *b;
  CK(cudaMalloc(&b, N * sizeof(int)));
  CK(cudaMemset(b, 0, N * sizeof(int)));
  std::thread launcher([&] {
    cudaStream_t t;
    CK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    while (!stop.load()) {
      add_all<<<blocks_for(N), 256, 0, t>>>(b, N, 1);
      launched++;
      if (launched % 16 == 0) CK(cudaStreamSynchronize(t));
    }
    CK(cudaStreamSynchronize(t));
    CK(cudaStreamDestroy(t));
  });

  uint64_t want = 0;
  for (int x : snapshot) want = want * 31 + (unsigned)x;
  want += 1;
  // Rounds 0-3: children leave with _exit while the launcher thread runs (a CUDA lock may be
  // held at the fork). Rounds 4-5: the launcher has stopped; children leave with exit(), which
  // runs the runtime's atexit teardown in the child.
  for (int round = 0; round < 6; round++) {
    bool use_exit = round >= 4;
    if (round == 4) {
      stop = true;
      launcher.join();
    }
    // While the launcher runs, fork only after it made progress since the last fork, so every
    // fork lands among its launches (a fork is much quicker than a launch burst otherwise).
    if (!use_exit) {
      long seen = launched.load();
      double tw = now_s();
      while (launched.load() < seen + 8 && now_s() - tw < 10) std::this_thread::yield();
      char pname[64];
      snprintf(pname, sizeof pname, "launcher_progress_before_fork_%d", round);
      check(launched.load() >= seen + 8, pname, "the launcher thread made no progress in 10 s");
    }
    // Queue long work before forking: it must complete normally in the parent.
    spin(s, 30.0);
    add_all<<<blocks_for(N), 256, 0, s>>>(a, N, 1);
    int fds[2];
    if (pipe(fds) != 0) return 3;
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      child_main(snapshot, fds[1], use_exit);
    }
    close(fds[1]);
    uint64_t got = 0;
    ssize_t n = read(fds[0], &got, sizeof got);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    char name[64];
    snprintf(name, sizeof name, "child_%s_ok_%d", use_exit ? "exit" : "_exit", round);
    check(n == (ssize_t)sizeof got && got == want && WIFEXITED(status) && WEXITSTATUS(status) == 0, name,
          "read %zd bytes, checksum %s, status 0x%x", n, got == want ? "right" : "wrong", status);
  }
  CK(cudaStreamSynchronize(s));
  std::vector<int> v = to_host(a, N);
  expect_affine(v, 3, 1 + 6, "parent_work_across_forks");
  g_digest.add_vec(v);
  long total = launched.load();
  v = to_host(b, N);
  bool ok = true;
  for (int i = 0; i < N && ok; i++) ok = v[i] == (int)total;
  check(ok, "parent_launcher_thread_across_forks", "b[0]=%d, %ld launches", v[0], total);
  note("launcher thread made %ld launches during the forks", total);

  // The parent keeps working after the children are gone.
  iota<<<blocks_for(N), 256, 0, s>>>(a, N, 5, 5);
  CK(cudaStreamSynchronize(s));
  v = to_host(a, N);
  expect_affine(v, 5, 5, "parent_after_forks");
  g_digest.add_vec(v);
  return finish();
}
