/* Many threads launching at once: some on streams of their own (blocking and non-blocking),
 * some sharing one stream, some on the legacy default stream, with the three launch forms
 * (parameter pointers, an argument buffer, cuLaunchKernelEx), copies and event records between.
 * Each thread checks its own work after synchronizing; the test checks every thread's order. */
#include "cu.h"
#include "scenarios.h"
#include <pthread.h>
#include <stdlib.h>

#define THREADS 10
#define PER_THREAD 40

static CUstream shared;

struct job {
    int t;
    CUstream s;
};

static void *run(void *arg) {
    struct job *j = arg;
    thread_setup();
    CUevent ev;
    CHECK(cu.EventCreate(&ev, 0));
    CUdeviceptr x;
    CHECK(cu.MemAlloc(&x, 64));
    unsigned seed = (unsigned)j->t * 7919u + 1u;
    for (long i = 0; i < PER_THREAD; i++) {
        long id = 10000L * (j->t + 1) + i;
        long us = (long)(rand_r(&seed) % 200);
        CUresult r;
        switch (i % 3) {
        case 0: r = launch(j->s, id, us, 0, 0); break;
        case 1: r = launch_extra(j->s, id, us); break;
        default: r = launch_ex(j->s, id, us); break;
        }
        EXPECT(r == 0, "thread %d: launch of %ld returned %d", j->t, id, r);
        if (i % 7 == 6) {
            long v = id;
            CHECK(cu.MemcpyHtoDAsync(x, &v, sizeof v, j->s));
        }
        if (i % 10 == 9) {
            CHECK(cu.EventRecord(ev, j->s));
            CHECK(cu.EventSynchronize(ev));
            EXPECT(cu.state(id) == DONE, "thread %d: cuEventSynchronize returned before kernel %ld ran", j->t, id);
        }
    }
    CHECK(cu.StreamSynchronize(j->s));
    for (long i = 0; i < PER_THREAD; i++) {
        long id = 10000L * (j->t + 1) + i;
        EXPECT(cu.state(id) == DONE, "thread %d: kernel %ld did not run before the synchronize returned", j->t, id);
    }
    return NULL;
}

void threads(void) {
    shared = new_stream(0);
    struct job jobs[THREADS];
    pthread_t ts[THREADS];
    for (int t = 0; t < THREADS; t++) {
        jobs[t].t = t;
        /* 0-3: own blocking streams, 4-5: own non-blocking, 6-7: one shared stream, 8-9: legacy. */
        jobs[t].s = t < 4 ? new_stream(0) : t < 6 ? new_stream(CU_STREAM_NON_BLOCKING) : t < 8 ? shared : 0;
    }
    for (int t = 0; t < THREADS; t++) pthread_create(&ts[t], NULL, run, &jobs[t]);
    for (int t = 0; t < THREADS; t++) pthread_join(ts[t], NULL);
    CHECK(cu.CtxSynchronize());
}
