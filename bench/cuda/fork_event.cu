// Does a forked child hang in exit() natively when its parent had GPU work in flight at the fork,
// and does it matter whether an event was recorded behind that work? (The shim records such sync
// events; `fork_after_init` under the shim hangs in libcuda's destructor now and then.)
//
//   nvcc -O2 -arch=native -o fork_event fork_event.cu && ./fork_event [ROUNDS] [SPIN_MS]
//
// For each mode, ROUNDS forks; the child leaves with exit(0) (running CUDA's exit handlers); a
// child still alive after 5 s counts as a hang and is killed. One JSON line per mode.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <signal.h>
#include <sys/wait.h>
#include <thread>
#include <time.h>
#include <unistd.h>

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t err_ = (x);                                                                       \
    if (err_ != cudaSuccess) {                                                                  \
      fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(err_));                                  \
      exit(2);                                                                                 \
    }                                                                                          \
  } while (0)

__global__ void spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

static double now_s() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// true if the child exited by itself within 5 s
static bool fork_and_reap() {
  pid_t pid = fork();
  if (pid == 0) exit(0);
  double t0 = now_s();
  int status;
  while (now_s() - t0 < 5.0) {
    if (waitpid(pid, &status, WNOHANG) == pid) return true;
    usleep(1000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return false;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 20;
  double spin_ms = argc > 2 ? atof(argv[2]) : 30.0;
  int clock_khz;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  long long cycles = (long long)(spin_ms * clock_khz);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  // The last three destroy a stream or an event while work is still in flight behind it (the
  // driver then finishes the destruction later, on a thread of its own).
  // The last three fork just after a second thread launched on a stream of its own and exited
  // (as fork_after_init's fourth fork does), with the stream destroyed or kept, at once or 50 ms
  // later.
  const char *modes[] = {"idle", "work", "work+event", "work+event-queried",
                         "stream-destroyed-busy", "stream-destroyed-synced", "event-destroyed-busy",
                         "thread-exited", "thread-exited-stream-kept", "thread-exited-then-50ms"};
  const char *only = getenv("FORK_EVENT_MODES");  // a comma list of mode numbers, default all
  for (int m = 0; m < 10; m++) {
    char tag[12];
    snprintf(tag, sizeof tag, "%d", m);
    if (only && !strstr(only, tag)) continue;
    int hangs = 0;
    for (int r = 0; r < rounds; r++) {
      if (m >= 1 && m <= 3) spin<<<1, 1, 0, s>>>(cycles);
      if (m >= 2 && m <= 3) CK(cudaEventRecord(ev, s));
      if (m == 3) (void)cudaEventQuery(ev);  // someone looked at it before the fork
      if (m == 4 || m == 5) {
        cudaStream_t t;
        CK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
        spin<<<1, 1, 0, t>>>(cycles);
        if (m == 5) CK(cudaStreamSynchronize(t));
        CK(cudaStreamDestroy(t));
      }
      if (m == 6) {
        cudaEvent_t e;
        CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        spin<<<1, 1, 0, s>>>(cycles);
        CK(cudaEventRecord(e, s));
        CK(cudaEventDestroy(e));
      }
      if (m >= 7) {
        std::thread th([&] {
          cudaStream_t t;
          CK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
          for (int i = 0; i < 64; i++) {
            spin<<<1, 1, 0, t>>>(cycles / 1000);
            if (i % 16 == 15) CK(cudaStreamSynchronize(t));
          }
          CK(cudaStreamSynchronize(t));
          if (m != 8) CK(cudaStreamDestroy(t));
        });
        th.join();
        if (m == 9) usleep(50000);
        spin<<<1, 1, 0, s>>>(cycles);
      }
      if (!fork_and_reap()) hangs++;
      CK(cudaDeviceSynchronize());
    }
    printf("{\"mode\": \"%s\", \"rounds\": %d, \"hangs\": %d, \"spin_ms\": %.1f}\n", modes[m], rounds, hangs,
           spin_ms);
    fflush(stdout);
  }
  return 0;
}
