// Cache-line round trip between CPU 0 (or FROM) and every other CPU: two pinned threads bounce a
// counter; prints the median of 7 batches of 20000 round trips per pair, in ns.
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static _Alignas(128) atomic_long ball;
static int n_trips = 20000;
static void pin(int cpu) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu, &s); pthread_setaffinity_np(pthread_self(), sizeof s, &s); }
static void *pong(void *arg) {
  pin(*(int *)arg);
  for (long i = 0; i < 7L * n_trips; i++) {
    while (atomic_load_explicit(&ball, memory_order_acquire) != 2 * i + 1) __builtin_ia32_pause();
    atomic_store_explicit(&ball, 2 * i + 2, memory_order_release);
  }
  return 0;
}
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return (x > y) - (x < y); }
int main(int argc, char **argv) {
  int from = argc > 1 ? atoi(argv[1]) : 0, n = sysconf(_SC_NPROCESSORS_ONLN);
  printf("from cpu %d:", from);
  for (int j = 0; j < n; j++) {
    if (j == from) { printf(" -"); continue; }
    atomic_store(&ball, 0);
    pthread_t t; pthread_create(&t, 0, pong, &j);
    pin(from);
    double b[7]; long i = 0;
    for (int k = 0; k < 7; k++) {
      double t0 = now();
      for (long e = i + n_trips; i < e; i++) {
        atomic_store_explicit(&ball, 2 * i + 1, memory_order_release);
        while (atomic_load_explicit(&ball, memory_order_acquire) != 2 * i + 2) __builtin_ia32_pause();
      }
      b[k] = (now() - t0) / n_trips;
    }
    pthread_join(t, 0);
    qsort(b, 7, sizeof b[0], cmp);
    printf(" %.0f", b[3]);
    fflush(stdout);
  }
  printf("\n");
  return 0;
}
