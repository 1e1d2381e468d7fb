// What one clock read costs here: CLOCK_MONOTONIC through the vDSO (or not), and rdtsc.
#include <stdio.h>
#include <time.h>
#include <x86intrin.h>
static double ns(struct timespec a, struct timespec b) { return (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec); }
int main(void) {
    enum { N = 2000000 };
    struct timespec a, b, t;
    volatile unsigned long long sink = 0;
    for (int round = 0; round < 3; round++) {
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int i = 0; i < N; i++) { clock_gettime(CLOCK_MONOTONIC, &t); sink += t.tv_nsec; }
        clock_gettime(CLOCK_MONOTONIC, &b);
        double mono = ns(a, b) / N;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int i = 0; i < N; i++) sink += __rdtsc();
        clock_gettime(CLOCK_MONOTONIC, &b);
        printf("clock_gettime(MONOTONIC) %.1f ns, rdtsc %.1f ns\n", mono, ns(a, b) / N);
    }
    return (int)(sink & 0);
}
