/* An application that reaches libcuda the way the CUDA runtime does: dlopen, then dlsym of
 * cuGetProcAddress_v2, then every entry point through it. Launches N kernels on stream 0x10
 * with arguments it overwrites right after each call, interleaved with copies, then syncs
 * (with FAKE_APP_COPIES_ONLY: N copies and no launch). Prints how many launches the shim saw
 * (0 when it is absent or off). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int (*getproc_t)(const char *, void **, int, unsigned long long, int *);
typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);
typedef int (*copy_t)(unsigned long long, const void *, size_t, void *);
typedef int (*sync_t)(void *);

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 50;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    getproc_t getproc = (getproc_t)dlsym(h, "cuGetProcAddress_v2");
    launch_t launch = 0; copy_t copy = 0; sync_t sync = 0;
    if (getproc("cuLaunchKernel", (void **)&launch, 12000, 0, 0) ||
        getproc("cuMemcpyHtoDAsync", (void **)&copy, 12000, 0, 0) ||
        getproc("cuStreamSynchronize", (void **)&sync, 12000, 0, 0)) return 3;
    void *stream = (void *)0x10;
    int copies_only = getenv("FAKE_APP_COPIES_ONLY") != NULL;
    for (int i = 0; i < n; i++) {
        if (copies_only) {
            if (copy(0, &i, sizeof i, stream)) return 5;
            continue;
        }
        int a = i; long b = 10L * i;
        void *params[2] = {&a, &b};
        if (launch((void *)0xf00, 1, 1, 1, 1, 1, 1, 0, stream, params, 0)) return 4;
        a = -1; b = -1; /* the shim must have copied them */
        if (i % 10 == 9) {
            int v = i;
            if (copy(0, &v, sizeof v, stream)) return 5;
        }
    }
    if (sync(stream)) return 6;
    /* Time for the shim's threads to act on what they saw (the pass-through observer). */
    if (getenv("FAKE_APP_LINGER_MS")) usleep(1000 * atoi(getenv("FAKE_APP_LINGER_MS")));
    unsigned long long (*seen)(void) = (unsigned long long (*)(void))dlsym(RTLD_DEFAULT, "xpreempt_shim_cuda_launches");
    printf("%llu\n", seen ? seen() : 0ULL);
    return 0;
}
