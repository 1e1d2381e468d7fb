/* Stream capture: a capture begins only after the stream's buffered work reached the driver,
 * what a capturing stream gets is captured (not run), a captured graph's launch is one command
 * of the shim's queue, and work on other streams during a capture (legal in every capture mode)
 * does not break the capture: the simulated driver invalidates a capture, as CUDA does, when a
 * thread makes a potentially unsafe call (a query or synchronize) that the capture mode forbids. */
#include "cu.h"
#include "scenarios.h"
#include <pthread.h>

void capture(void) {
    CUstream a = new_stream(0);
    unsigned long long launches = shim_launches();
    K(a, 1, 0, F_GATE, 0);
    K(a, 2, 1000, 0, 0);
    release_after(1, 10);
    CHECK(cu.StreamBeginCapture(a, MODE_GLOBAL));
    EXPECT(cu.state(2) != ABSENT, "the capture began while kernel 2 was still held by the shim");
    K(a, 10, 300, 0, 0);
    K(a, 11, 300, 0, 0);
    void *g, *exec;
    CHECK(cu.StreamEndCapture(a, &g));
    EXPECT(cu.state(10) == ABSENT && cu.state(11) == ABSENT, "captured kernels ran");
    CHECK(cu.GraphInstantiate(&exec, g, 0));
    K(a, 20, 0, F_GATE, 0);
    CHECK(cu.GraphLaunch(exec, a));
    K(a, 21, 200, 0, 0);
    CHECK(cu.GraphLaunch(exec, a));
    release_after(20, 10);
    CHECK(cu.StreamSynchronize(a));
    EXPECT(cu.runs(10) == 2 && cu.runs(11) == 2, "the graph's kernels ran %ld and %ld times, not twice", cu.runs(10), cu.runs(11));
    /* (The test checks the whole order in the driver's log; here: the second launch.) */
    EXPECT(cu.before(21, 10), "the second graph launch ran before kernel 21 ended");
    /* Kernels 1, 2, 20, 21 and the two graph launches went through the queue; 10 and 11 were
     * captured straight through. */
    if (under_shim) EXPECT(shim_launches() - launches == 6, "%llu launches were queued, not 6", shim_launches() - launches);
}

struct worker {
    CUstream s;
    long base;
    int sync;
};

static void *work_on_other_stream(void *arg) {
    struct worker *w = arg;
    thread_setup();
    for (long j = 0; j < 30; j++) K(w->s, w->base + j, 100, 0, 0);
    /* A synchronize is only allowed beside a thread-local or relaxed capture. */
    if (w->sync) CHECK(cu.StreamSynchronize(w->s));
    return NULL;
}

void capture_beside_work(void) {
    CUstream a = new_stream(0), b = new_stream(CU_STREAM_NON_BLOCKING);
    /* b has work in flight when each capture begins. */
    const int modes[3] = {MODE_GLOBAL, MODE_THREAD_LOCAL, MODE_RELAXED};
    for (int m = 0; m < 3; m++) {
        long base = 1000 * (m + 1);
        for (long j = 0; j < 8; j++) K(b, base + 500 + j, 300, 0, 0);
        CHECK(cu.StreamBeginCapture(a, modes[m]));
        struct worker w = {b, base, modes[m] != MODE_GLOBAL};
        pthread_t t;
        pthread_create(&t, NULL, work_on_other_stream, &w);
        /* The capturing thread launches on another stream too. */
        for (long j = 0; j < 10; j++) K(b, base + 100 + j, 100, 0, 0);
        K(a, base + 200, 100, 0, 0);
        pthread_join(t, NULL);
        void *g = 0, *exec;
        CUresult r = cu.StreamEndCapture(a, &g);
        EXPECT(r == 0, "the capture in mode %d ended with %d: work on another stream broke it", modes[m], r);
        CHECK(cu.StreamSynchronize(b));
        for (long j = 0; j < 30; j++) EXPECT(cu.state(base + j) == DONE, "kernel %ld on the other stream did not run", base + j);
        CHECK(cu.GraphInstantiate(&exec, g, 0));
        CHECK(cu.GraphLaunch(exec, a));
        CHECK(cu.StreamSynchronize(a));
        EXPECT(cu.runs(base + 200) == 1, "the captured kernel ran %ld times", cu.runs(base + 200));
    }
}

struct capturer {
    long base;
    int failed;
};

/* Each round: a kernel, then a capture that begins right behind it on the same stream. */
static void *capture_rounds(void *arg) {
    struct capturer *c = arg;
    thread_setup();
    CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
    for (long i = 0; i < 40; i++) {
        long id = c->base + 2 * i;
        K(s, id, 20, 0, 0);
        void *g = 0, *exec;
        CHECK(cu.StreamBeginCapture(s, MODE_THREAD_LOCAL));
        K(s, id + 1, 20, 0, 0);
        if (cu.StreamEndCapture(s, &g) != 0) {
            c->failed++;
            continue;
        }
        CHECK(cu.GraphInstantiate(&exec, g, 0));
        CHECK(cu.GraphLaunch(exec, s));
    }
    CHECK(cu.StreamSynchronize(s));
    return NULL;
}

/* Several threads capture at once, each on its own stream right behind its own work, as
 * PyTorch's graph pools do: nothing of the shim's may land in (and so break) a capture. */
void captures_in_threads(void) {
    enum { T = 6 };
    struct capturer c[T];
    pthread_t t[T];
    for (int i = 0; i < T; i++) {
        c[i] = (struct capturer){10000 * (i + 1), 0};
        pthread_create(&t[i], NULL, capture_rounds, &c[i]);
    }
    for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < T; i++) {
        EXPECT(c[i].failed == 0, "thread %d: %d of 40 captures failed", i, c[i].failed);
        for (long j = 0; j < 80; j++) EXPECT(cu.runs(c[i].base + j) == 1, "kernel %ld ran %ld times", c[i].base + j, cu.runs(c[i].base + j));
    }
}

/* A graph of kernels `first` and `first + 1` (300 us each), captured on a stream of its own. */
static void *two_kernel_graph(long first) {
    CUstream c = new_stream(0);
    void *g, *exec;
    CHECK(cu.StreamBeginCapture(c, MODE_THREAD_LOCAL));
    K(c, first, 300, 0, 0);
    K(c, first + 1, 300, 0, 0);
    CHECK(cu.StreamEndCapture(c, &g));
    CHECK(cu.GraphInstantiate(&exec, g, 0));
    return exec;
}

/* A graph launched on the legacy default stream keeps that stream's order both ways: it follows
 * kernel 2 (and so kernel 1 on a blocking stream), and kernel 3 on the legacy stream and kernel 4
 * on the blocking stream follow it. (The test reads each kernel's stream priority in the driver's
 * log: the graph stays at the legacy stream's.) */
void graph_legacy(void) {
    CUstream a = new_stream(0);
    void *exec = two_kernel_graph(10);
    K(a, 1, 500, 0, 0);
    K(0, 2, 300, 0, 0);
    CHECK(cu.GraphLaunch(exec, 0));
    K(0, 3, 100, 0, 0);
    K(a, 4, 100, 0, 0);
    CHECK(cu.CtxSynchronize());
}

/* The same before and after the primary context is reset: the new context's graph keeps its
 * legacy stream's order too. */
void graph_legacy_reset(void) {
    void *exec = two_kernel_graph(10);
    K(0, 1, 300, 0, 0);
    CHECK(cu.GraphLaunch(exec, 0));
    K(0, 2, 100, 0, 0);
    CHECK(cu.DevicePrimaryCtxReset(0));
    use_primary();
    exec = two_kernel_graph(12);
    K(0, 3, 300, 0, 0);
    CHECK(cu.GraphLaunch(exec, 0));
    K(0, 4, 100, 0, 0);
    CHECK(cu.CtxSynchronize());
}
