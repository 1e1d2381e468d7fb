/* The test application's loader, helpers and entry point: `app SCENARIO` runs one scenario,
 * prints "result launches=L buffered=B" and exits 0, or prints "FAIL ..." and exits 1; a watchdog
 * ends a scenario that hangs (exit 98). */
#define _GNU_SOURCE
#include "cu.h"
#include "scenarios.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct cu cu;
CUcontext primary;
CUfunction kern;
int under_shim;
const char *scenario = "?";

typedef CUresult (*getproc_t)(const char *, void **, int, unsigned long long, int *);

void fail(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "FAIL %s: %s\n", scenario, buf);
    fflush(stderr);
    _exit(1);
}

static void *lookup_version(getproc_t getproc, const char *name, int version, unsigned long long flags) {
    void *p = NULL;
    int status = 0;
    if (getproc(name, &p, version, flags, &status) || !p) fail("cuGetProcAddress(%s)", name);
    return p;
}

static void *lookup(getproc_t getproc, const char *name, unsigned long long flags) {
    return lookup_version(getproc, name, 12000, flags);
}

static void *sim(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) fail("dlsym(%s)", name);
    return p;
}

void setup(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) fail("dlopen: %s", dlerror());
    getproc_t getproc = (getproc_t)dlsym(h, "cuGetProcAddress_v2");
    if (!getproc) fail("no cuGetProcAddress_v2");
#define L(field, name) cu.field = lookup(getproc, name, 0)
    L(Init, "cuInit");
    L(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    L(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease");
    L(DevicePrimaryCtxReset, "cuDevicePrimaryCtxReset");
    L(CtxCreate, "cuCtxCreate");
    L(CtxDestroy, "cuCtxDestroy");
    L(CtxSetCurrent, "cuCtxSetCurrent");
    L(CtxSynchronize, "cuCtxSynchronize");
    L(StreamCreate, "cuStreamCreate");
    L(StreamDestroy, "cuStreamDestroy");
    L(StreamSynchronize, "cuStreamSynchronize");
    L(StreamQuery, "cuStreamQuery");
    L(StreamWaitEvent, "cuStreamWaitEvent");
    L(StreamBeginCapture, "cuStreamBeginCapture");
    L(StreamEndCapture, "cuStreamEndCapture");
    L(ThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode");
    L(EventCreate, "cuEventCreate");
    L(EventDestroy, "cuEventDestroy");
    L(EventRecord, "cuEventRecord");
    L(EventQuery, "cuEventQuery");
    L(EventSynchronize, "cuEventSynchronize");
    L(LaunchHostFunc, "cuLaunchHostFunc");
    L(MemAlloc, "cuMemAlloc");
    L(MemFree, "cuMemFree");
    L(MemcpyHtoD, "cuMemcpyHtoD");
    L(MemcpyDtoH, "cuMemcpyDtoH");
    L(MemsetD32, "cuMemsetD32");
    L(MemsetD32Async, "cuMemsetD32Async");
    L(MemcpyHtoDAsync, "cuMemcpyHtoDAsync");
    L(MemcpyDtoHAsync, "cuMemcpyDtoHAsync");
    L(ModuleLoadData, "cuModuleLoadData");
    L(ModuleGetFunction, "cuModuleGetFunction");
    L(ModuleUnload, "cuModuleUnload");
    L(LibraryLoadData, "cuLibraryLoadData");
    L(LibraryGetKernel, "cuLibraryGetKernel");
    L(LibraryUnload, "cuLibraryUnload");
    L(LaunchKernel, "cuLaunchKernel");
    L(LaunchKernelEx, "cuLaunchKernelEx");
    L(GraphInstantiate, "cuGraphInstantiate");
    L(GraphLaunch, "cuGraphLaunch");
#undef L
    cu.LaunchKernel_pt = lookup(getproc, "cuLaunchKernel", 2);
    cu.StreamSynchronize_pt = lookup(getproc, "cuStreamSynchronize", 2);
    cu.StreamQuery_pt = lookup(getproc, "cuStreamQuery", 2);
    cu.MemcpyDtoH_pt = lookup(getproc, "cuMemcpyDtoH", 2);
    cu.DevicePrimaryCtxRelease_rt = lookup_version(getproc, "cuDevicePrimaryCtxRelease", 7000, 0);
    cu.DevicePrimaryCtxReset_rt = lookup_version(getproc, "cuDevicePrimaryCtxReset", 7000, 0);
    cu.state = sim(h, "sim_state");
    cu.before = sim(h, "sim_before");
    cu.runs = sim(h, "sim_runs");
    cu.stops = sim(h, "sim_stops");
    cu.release = sim(h, "sim_release");
    CHECK(cu.Init(0));
    use_primary();
}

void use_primary(void) {
    CHECK(cu.DevicePrimaryCtxRetain(&primary, 0));
    CHECK(cu.CtxSetCurrent(primary));
    CUmodule m;
    CHECK(cu.ModuleLoadData(&m, "image"));
    CHECK(cu.ModuleGetFunction(&kern, m, "kernel"));
}

void thread_setup(void) { CHECK(cu.CtxSetCurrent(primary)); }

CUstream new_stream(unsigned flags) {
    CUstream s;
    CHECK(cu.StreamCreate(&s, flags));
    return s;
}

CUresult launch_fn(CUfunction f, CUstream s, long id, long us, unsigned long flags, CUdeviceptr ptr) {
    long a = id, b = us;
    unsigned long c = flags;
    CUdeviceptr d = ptr;
    void *params[4] = {&a, &b, &c, &d};
    CUresult r = cu.LaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, params, NULL);
    a = b = POISON, c = (unsigned long)POISON, d = (CUdeviceptr)POISON;
    return r;
}

CUresult launch(CUstream s, long id, long us, unsigned long flags, CUdeviceptr ptr) {
    return launch_fn(kern, s, id, us, flags, ptr);
}

CUresult launch_extra(CUstream s, long id, long us) {
    long buf[4] = {id, us, 0, 0};
    size_t size = sizeof buf;
    void *extra[] = {(void *)1, buf, (void *)2, &size, (void *)0};
    CUresult r = cu.LaunchKernel(kern, 1, 1, 1, 32, 1, 1, 0, s, NULL, extra);
    buf[0] = buf[1] = buf[2] = buf[3] = POISON;
    return r;
}

CUresult launch_ex(CUstream s, long id, long us) {
    long a = id, b = us, c = 0, d = 0;
    void *params[4] = {&a, &b, &c, &d};
    unsigned char config[56] = {0};
    unsigned *dims = (unsigned *)config;
    for (int i = 0; i < 6; i++) dims[i] = 1;
    memcpy(config + 32, &s, sizeof s);
    CUresult r = cu.LaunchKernelEx(config, kern, params, NULL);
    a = b = c = d = POISON;
    memset(config, 0x5a, sizeof config);
    return r;
}

CUresult launch_pt(CUstream s, long id, long us) {
    long a = id, b = us, c = 0, d = 0;
    void *params[4] = {&a, &b, &c, &d};
    CUresult r = cu.LaunchKernel_pt(kern, 1, 1, 1, 32, 1, 1, 0, s, params, NULL);
    a = b = c = d = POISON;
    return r;
}

void K(CUstream s, long id, long us, unsigned long flags, CUdeviceptr ptr) {
    CUresult r = launch(s, id, us, flags, ptr);
    if (r) fail("launch of kernel %ld returned %d", id, r);
}

void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

struct release {
    long id;
    int ms;
};

static void *releaser(void *arg) {
    struct release *r = arg;
    sleep_ms(r->ms);
    cu.release(r->id);
    free(r);
    return NULL;
}

void release_after(long id, int ms) {
    struct release *r = malloc(sizeof *r);
    r->id = id, r->ms = ms;
    pthread_t t;
    pthread_create(&t, NULL, releaser, r);
    pthread_detach(t);
}

unsigned long long shim_counter(const char *name) {
    unsigned long long (*f)(void) = (unsigned long long (*)(void))dlsym(RTLD_DEFAULT, name);
    return f ? f() : 0;
}
unsigned long long shim_launches(void) { return shim_counter("xpreempt_shim_cuda_launches"); }
unsigned long long shim_buffered(void) { return shim_counter("xpreempt_shim_cuda_buffered"); }

void await_state(long id, int st) {
    for (int i = 0; i < 20000; i++) {
        if (cu.state(id) == st) return;
        sleep_ms(1);
    }
    fail("kernel %ld never reached state %d (it is in %d)", id, st, cu.state(id));
}

void expect_line(const char *want) {
    char line[128];
    if (!fgets(line, sizeof line, stdin)) fail("stdin closed while waiting for '%s'", want);
    line[strcspn(line, "\n")] = 0;
    if (strcmp(line, want)) fail("expected '%s' from the test, got '%s'", want, line);
}

void say(const char *line) {
    printf("%s\n", line);
    fflush(stdout);
}

static void *watchdog(void *arg) {
    int seconds = *(int *)arg;
    sleep_ms(seconds * 1000);
    fprintf(stderr, "FAIL %s: timed out after %d s (hung?)\n", scenario, seconds);
    fflush(stderr);
    _exit(98);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: app SCENARIO\n");
        return 2;
    }
    scenario = argv[1];
    const char *s = getenv("APP_UNDER_SHIM");
    under_shim = s && !strcmp(s, "1");
    static int timeout = 60;
    const char *t = getenv("APP_TIMEOUT_S");
    if (t) timeout = atoi(t);
    pthread_t w;
    pthread_create(&w, NULL, watchdog, &timeout);
    pthread_detach(w);
#define RUN(name, fn)                                                                              \
    if (!strcmp(scenario, name)) {                                                                 \
        setup();                                                                                   \
        fn();                                                                                      \
        printf("result launches=%llu buffered=%llu\n", shim_launches(), shim_buffered());          \
        fflush(stdout);                                                                            \
        return 0;                                                                                  \
    }
    SCENARIOS(RUN)
    fprintf(stderr, "unknown scenario %s\n", scenario);
    return 2;
}
