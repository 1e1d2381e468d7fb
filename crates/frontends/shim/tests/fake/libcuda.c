/* A stand-in for libcuda.so.1 in tests without a GPU: every call succeeds at once, "work"
 * completes at once, and each launch, copy and record is logged (with the launching thread)
 * to $FAKE_CUDA_LOG, so a test sees what reached the driver, in which order, with which
 * arguments. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>

typedef int CUresult;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *out;
static long main_tid;

__attribute__((constructor)) static void init(void) { main_tid = syscall(SYS_gettid); }

static void logf_(const char *fmt, long a, long b, long c) {
    pthread_mutex_lock(&lock);
    if (!out) { const char *p = getenv("FAKE_CUDA_LOG"); out = fopen(p ? p : "/dev/null", "w"); }
    fprintf(out, fmt, a, b, c);
    fprintf(out, " %s\n", syscall(SYS_gettid) == main_tid ? "main" : "other");
    fflush(out);
    pthread_mutex_unlock(&lock);
}

#define FAKE_CTX ((void *)0x1000)
#define KERNEL ((void *)0xf00)

CUresult cuInit(unsigned f) { (void)f; return 0; }
CUresult cuCtxGetCurrent(void **c) { *c = FAKE_CTX; return 0; }
CUresult cuCtxPushCurrent_v2(void *c) { (void)c; return 0; }
CUresult cuCtxPopCurrent_v2(void **c) { if (c) *c = FAKE_CTX; return 0; }
CUresult cuCtxGetDevice(int *d) { *d = 0; return 0; }
CUresult cuStreamGetCtx(void *s, void **c) { (void)s; *c = FAKE_CTX; return 0; }
CUresult cuStreamGetFlags(void *s, unsigned *f) { *f = ((long)s == 0x20) ? 1 : 0; return 0; }
CUresult cuStreamIsCapturing(void *s, int *st) { (void)s; *st = 0; return 0; }
CUresult cuEventCreate(void **e, unsigned f) { (void)f; *e = malloc(8); return 0; }
CUresult cuEventDestroy_v2(void *e) { free(e); return 0; }
CUresult cuEventQuery(void *e) { (void)e; return 0; }
CUresult cuEventSynchronize(void *e) { (void)e; return 0; }
CUresult cuEventRecord(void *e, void *s) { (void)e; logf_("record s=%lx%.0ld%.0ld", (long)s, 0, 0); return 0; }
CUresult cuStreamSynchronize(void *s) { logf_("sync s=%lx%.0ld%.0ld", (long)s, 0, 0); return 0; }
CUresult cuStreamQuery(void *s) { (void)s; return 0; }
/* The fake kernel takes (int a, long b): offsets 0 and 8. */
CUresult cuFuncGetParamInfo(void *f, size_t i, size_t *off, size_t *size) {
    if (f != KERNEL) return 400;
    if (i == 0) { *off = 0; *size = 4; return 0; }
    if (i == 1) { *off = 8; *size = 8; return 0; }
    return 1;
}
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned smem, void *s, void **params, void **extra) {
    (void)f; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)smem; (void)extra; (void)gx;
    logf_("launch s=%lx a=%ld b=%ld", (long)s, (long)*(int *)params[0], *(long *)params[1]);
    return 0;
}
CUresult cuMemcpyHtoDAsync_v2(unsigned long long dst, const void *src, size_t n, void *s) {
    (void)dst; (void)n;
    logf_("copy s=%lx v=%ld%.0ld", (long)s, (long)*(const int *)src, 0);
    return 0;
}
CUresult cuGetProcAddress_v2(const char *name, void **pfn, int v, unsigned long long flags, int *st) {
    (void)v; (void)flags;
    if (st) *st = 0;
    if (!strcmp(name, "cuLaunchKernel")) { *pfn = (void *)cuLaunchKernel; return 0; }
    if (!strcmp(name, "cuStreamSynchronize")) { *pfn = (void *)cuStreamSynchronize; return 0; }
    if (!strcmp(name, "cuMemcpyHtoDAsync")) { *pfn = (void *)cuMemcpyHtoDAsync_v2; return 0; }
    *pfn = 0;
    return 500;
}
