/* Guard-built kernels (xpreempt_guard.cuh) under the shim's Lv2: the application passes the
 * header's placeholders (null flag, null completion array, epoch 0) and marks its guarded kernels
 * (the simulated module has xpreempt_guard_<name> for "guarded*" functions); under the shim at
 * Lv2 their guard parameters are filled in, a suspension stops them between blocks and the resume
 * relaunches them. Each block adds one to its own counter, so every counter must end at 1. */
#include "cu.h"
#include "scenarios.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCKS 8

static CUfunction guarded_fn, unmarked_fn;

static void load_guarded(void) {
    CUmodule m;
    CHECK(cu.ModuleLoadData(&m, "guarded image"));
    CHECK(cu.ModuleGetFunction(&guarded_fn, m, "guarded_work"));
    CHECK(cu.ModuleGetFunction(&unmarked_fn, m, "unmarked_work"));
}

/* Launches guard-built kernel f with the placeholders: `blocks` blocks of `us` microseconds,
 * each adding one to its counter at counters[block]; then overwrites the argument copies. */
static void GK(CUfunction f, CUstream s, long id, unsigned blocks, long us, CUdeviceptr counters) {
    const volatile int *flag = NULL;
    unsigned *done = NULL;
    unsigned epoch = 0;
    long a = id, b = us;
    unsigned long c = 0;
    CUdeviceptr d = counters;
    void *params[7] = {&flag, &done, &epoch, &a, &b, &c, &d};
    CUresult r = cu.LaunchKernel(f, blocks, 1, 1, 32, 1, 1, 0, s, params, NULL);
    flag = (const volatile int *)POISON, done = (unsigned *)POISON;
    a = b = POISON, c = (unsigned long)POISON, d = (CUdeviceptr)POISON;
    if (r) fail("launch of guarded kernel %ld returned %d", id, r);
}

/* Every one of n counters at p is 1 (read through the device's memory, which the simulated
 * device keeps in the host's: no CUDA call, so nothing waits for the shim). */
static void expect_once(CUdeviceptr p, int n, const char *what) {
    const unsigned *w = (const unsigned *)(uintptr_t)p;
    for (int i = 0; i < n; i++)
        EXPECT(w[i] == 1, "%s: block %d ran %u times", what, i, w[i]);
}

static void report(void) {
    printf("@guard guarded=%llu relaunched=%llu stopped_ahead=%llu lv3_lowered=%llu\n",
           shim_counter("xpreempt_shim_cuda_guarded"), shim_counter("xpreempt_shim_cuda_relaunched"),
           shim_counter("xpreempt_shim_cuda_stopped_ahead"), shim_counter("xpreempt_shim_test_lv3_lowered"));
}

/* Rounds of: guarded kernel, plain kernel, guarded kernel with an async copy of its counters
 * behind it, guarded kernel, guard-built kernel without a marker; ids 1000*round + 1..5. */
void guard_basic(void) {
    load_guarded();
    enum { ROUNDS = 12, PER = 4 };
    CUstream s = new_stream(0);
    CUdeviceptr c;
    CHECK(cu.MemAlloc(&c, ROUNDS * PER * BLOCKS * 4));
    CHECK(cu.MemsetD32(c, 0, ROUNDS * PER * BLOCKS));
    unsigned copies[ROUNDS][BLOCKS];
    memset(copies, 0, sizeof copies);
    for (long r = 0; r < ROUNDS; r++) {
        CUdeviceptr base = c + (CUdeviceptr)(r * PER * BLOCKS * 4);
        long id = 1000 * (r + 1);
        GK(guarded_fn, s, id + 1, BLOCKS, 150, base);
        K(s, id + 2, 100, 0, 0);
        GK(guarded_fn, s, id + 3, BLOCKS, 150, base + BLOCKS * 4);
        CHECK(cu.MemcpyDtoHAsync(copies[r], base + BLOCKS * 4, BLOCKS * 4, s));
        GK(guarded_fn, s, id + 4, BLOCKS, 150, base + 2 * BLOCKS * 4);
        GK(unmarked_fn, s, id + 5, BLOCKS, 50, base + 3 * BLOCKS * 4);
    }
    CHECK(cu.StreamSynchronize(s));
    for (int r = 0; r < ROUNDS; r++) {
        char what[64];
        snprintf(what, sizeof what, "round %d", r);
        expect_once(c + (CUdeviceptr)(r * PER * BLOCKS * 4), PER * BLOCKS, what);
        for (int b = 0; b < BLOCKS; b++)
            EXPECT(copies[r][b] == 1, "round %d: the copy behind kernel %d saw block %d at %u", r, 1000 * (r + 1) + 3,
                   b, copies[r][b]);
    }
    report();
}

static CUstream sync_stream;
static CUdeviceptr sync_counters;
static volatile int synced;

/* Synchronizes the stream while its guarded kernel runs and is stopped: the synchronize must not
 * return before the relaunch has run every block. */
static void *synchronizer(void *arg) {
    (void)arg;
    thread_setup();
    CHECK(cu.StreamSynchronize(sync_stream));
    expect_once(sync_counters, BLOCKS, "after a synchronize made while the kernel was stopped");
    synced = 1;
    return NULL;
}

/* Under a daemon (the test's holder takes the device): a long guarded kernel is stopped between
 * blocks, then relaunched for exactly its missing blocks. With GUARD_TAIL=1 an async copy follows
 * it on the stream before the suspension: the kernel must then run to its end (Lv1 drain). */
void guard_suspend(void) {
    load_guarded();
    const char *t = getenv("GUARD_TAIL");
    int tail = t && !strcmp(t, "1");
    CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
    CUdeviceptr c;
    CHECK(cu.MemAlloc(&c, BLOCKS * 4));
    CHECK(cu.MemsetD32(c, 0, BLOCKS));
    unsigned copy[BLOCKS] = {0};
    GK(guarded_fn, s, 201, BLOCKS, 40000, c);
    if (tail) CHECK(cu.MemcpyDtoHAsync(copy, c, sizeof copy, s));
    await_state(201, RUNNING);
    /* A synchronize in progress (not a copy) leaves the kernel stoppable. */
    pthread_t th;
    sync_stream = s, sync_counters = c;
    if (!tail) pthread_create(&th, NULL, synchronizer, NULL);
    say("@running");
    /* The test has a higher-priority process take the device: this queue is suspended. */
    expect_line("check");
    const unsigned *w = (const unsigned *)(uintptr_t)c;
    if (under_shim && !tail) {
        for (int i = 0; i < 2000 && cu.stops(201) == 0; i++) sleep_ms(1);
        EXPECT(cu.stops(201) == 1, "the guarded kernel was not stopped by the suspension");
        int ran = 0;
        for (int i = 0; i < BLOCKS; i++) {
            EXPECT(w[i] <= 1, "block %d ran %u times", i, w[i]);
            ran += (int)w[i];
        }
        EXPECT(ran < BLOCKS, "the stopped kernel ran all its blocks");
        EXPECT(cu.StreamQuery(s) == NOT_READY, "cuStreamQuery says ready while the stream holds a stopped kernel");
        EXPECT(!synced, "cuStreamSynchronize returned while the stream's kernel was stopped");
        /* Behind the stopped kernel: buffered, and run after its relaunch. */
        K(s, 202, 100, 0, 0);
    }
    if (under_shim && tail) EXPECT(cu.stops(201) == 0, "a guarded kernel with a copy behind it was stopped");
    say("@checked");
    expect_line("finish");
    if (!tail) pthread_join(th, NULL);
    CHECK(cu.StreamSynchronize(s));
    expect_once(c, BLOCKS, "the guarded kernel");
    if (!tail) EXPECT(synced, "the synchronizing thread did not finish");
    if (tail)
        for (int i = 0; i < BLOCKS; i++) EXPECT(copy[i] == 1, "the copy behind the kernel saw block %d at %u", i, copy[i]);
    report();
}

/* After an unload the driver may give the same handle to another kernel: the shim must ask again
 * (here a plain kernel gets the handle a guarded one had). */
void guard_unload(void) {
    CUstream s = new_stream(0);
    CUmodule a, b;
    CUfunction g, k;
    CUdeviceptr c;
    CHECK(cu.MemAlloc(&c, BLOCKS * 4));
    CHECK(cu.MemsetD32(c, 0, BLOCKS));
    CHECK(cu.ModuleLoadData(&a, "guarded image"));
    CHECK(cu.ModuleGetFunction(&g, a, "guarded_work"));
    unsigned long long before = shim_counter("xpreempt_shim_cuda_guarded");
    GK(g, s, 301, BLOCKS, 100, c);
    CHECK(cu.StreamSynchronize(s));
    unsigned long long after = shim_counter("xpreempt_shim_cuda_guarded");
    CHECK(cu.ModuleUnload(a));
    CHECK(cu.ModuleLoadData(&b, "plain image"));
    CHECK(cu.ModuleGetFunction(&k, b, "kernel"));
    EXPECT(k == g, "the simulated driver did not hand out the unloaded kernel's handle again");
    CHECK(launch_fn(k, s, 302, 100, 0, 0));
    CHECK(cu.StreamSynchronize(s));
    EXPECT(cu.state(302) == DONE, "the plain kernel on a reused handle did not run as launched");
    EXPECT(shim_counter("xpreempt_shim_cuda_guarded") == after, "the plain kernel got guard values");
    expect_once(c, BLOCKS, "the guarded kernel");
    printf("@guard guarded=%llu relaunched=0 stopped_ahead=0 lv3_lowered=0\n", after - before);
}
