/* Two processes under a real xpreemptd, for a suspension the test controls: `hold` (run at a high
 * priority) keeps its queue busy with a gated kernel, which it waits for, until the test tells it
 * to let go; while it does, the daemon keeps `suspended` (a low priority) suspended, so the
 * commands that process launches wait in the shim's buffer for certain. The two talk to the test on stdin and stdout. */
#include "cu.h"
#include "scenarios.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void called_back(void *arg) { (void)arg; }

/* Waits for the gated kernel on `s` as `how` says, without blocking: a stream query, a query of an
 * event recorded behind the kernel, or a host function behind it (a callback is a wait too). */
static void wait_for_gated(CUstream s, const char *how) {
    if (!strcmp(how, "event")) {
        CUevent behind;
        CHECK(cu.EventCreate(&behind, 0));
        CHECK(cu.EventRecord(behind, s));
        CUresult r = cu.EventQuery(behind);
        EXPECT(r == NOT_READY, "cuEventQuery returned %d for an event behind the gated kernel", r);
    } else if (!strcmp(how, "callback")) {
        CHECK(cu.LaunchHostFunc(s, called_back, NULL));
    } else {
        CUresult r = cu.StreamQuery(s);
        EXPECT(r == NOT_READY, "cuStreamQuery returned %d for the gated kernel", r);
    }
}

/* Holds until the test says release, then lets the gated kernel end. */
static void hold_until_released(CUstream s) {
    say("@holding");
    expect_line("release");
    cu.release(1);
    CHECK(cu.StreamSynchronize(s));
}

/* Work counts against lower queues once the application waits for it. */
void hold(void) {
    CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
    K(s, 1, 0, F_GATE, 0);
    wait_for_gated(s, "query");
    hold_until_released(s);
}

/* `hold`, except that it waits for its gated kernel only when the test says so, as HOLD_WAIT
 * says (`wait_for_gated`): until then the kernel is work nobody waits for, which leaves lower
 * queues running. HOLD_STREAM=per-thread launches it on the thread's per-thread stream. */
void hold_late(void) {
    const char *how = getenv("HOLD_WAIT");
    const char *stream = getenv("HOLD_STREAM");
    CUstream s = stream && !strcmp(stream, "per-thread") ? CU_STREAM_PER_THREAD
                                                         : new_stream(CU_STREAM_NON_BLOCKING);
    K(s, 1, 0, F_GATE, 0);
    say("@launched");
    expect_line("wait");
    wait_for_gated(s, how ? how : "query");
    hold_until_released(s);
}

static CUstream a, b;
static CUevent ev;
static volatile int recorded, stream_synced, ctx_synced;

static void *record_again(void *arg) {
    (void)arg;
    thread_setup();
    CHECK(cu.EventRecord(ev, a));
    recorded = 1;
    return NULL;
}

static void *sync_stream(void *arg) {
    (void)arg;
    thread_setup();
    CHECK(cu.StreamSynchronize(a));
    EXPECT(cu.state(3) == DONE, "cuStreamSynchronize returned before the suspended kernel 3 ran");
    stream_synced = 1;
    return NULL;
}

static void *sync_ctx(void *arg) {
    (void)arg;
    thread_setup();
    CHECK(cu.CtxSynchronize());
    EXPECT(cu.state(3) == DONE, "cuCtxSynchronize returned before the suspended kernel 3 ran");
    ctx_synced = 1;
    return NULL;
}

void suspended(void) {
    a = new_stream(CU_STREAM_NON_BLOCKING);
    b = new_stream(CU_STREAM_NON_BLOCKING);
    CHECK(cu.EventCreate(&ev, 0));
    /* The event's first record, after kernel 1; kernel 1 is done before the suspension. */
    K(a, 1, 100, 0, 0);
    CHECK(cu.EventRecord(ev, a));
    CHECK(cu.EventSynchronize(ev));
    say("@ready");
    /* The test has the higher-priority process hold the device: this queue is suspended. */
    expect_line("go");
    unsigned long long buffered = shim_buffered();
    K(a, 2, 100, 0, 0);
    K(a, 3, 100, 0, 0);
    if (under_shim) {
        EXPECT(shim_buffered() - buffered == 2, "the launches on the suspended stream were not buffered");
        EXPECT(cu.state(2) == ABSENT && cu.state(3) == ABSENT, "a suspended queue's kernel reached the driver");
        /* The device has nothing of this stream left: only the shim knows about kernels 2, 3. */
        CUresult r = cu.StreamQuery(a);
        EXPECT(r == NOT_READY, "cuStreamQuery returned %d with two kernels held by the shim", r);
    }
    /* The first record is complete, and stays the event's state until a new record happens. */
    EXPECT(cu.EventQuery(ev) == 0, "cuEventQuery of the completed first record says not ready");
    pthread_t t1, t2, t3;
    pthread_create(&t1, NULL, record_again, NULL);
    pthread_create(&t2, NULL, sync_stream, NULL);
    pthread_create(&t3, NULL, sync_ctx, NULL);
    say("@blocked");
    /* The test looks (for a while) whether anything of this process ran ahead of the holder. */
    expect_line("check");
    if (under_shim) {
        EXPECT(!recorded, "the record on the suspended stream returned before the stream's buffered kernels were launched");
        EXPECT(!stream_synced && !ctx_synced, "a synchronize returned while the stream was suspended");
    }
    say("@checked");
    /* The test lets the holder go: the queue resumes and everything completes. */
    expect_line("finish");
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    pthread_join(t3, NULL);
    CHECK(cu.StreamWaitEvent(b, ev, 0));
    K(b, 4, 0, 0, 0);
    CHECK(cu.StreamSynchronize(b));
    EXPECT(cu.before(3, 4), "stream b waited for the event's earlier record: kernel 4 ran before kernel 3 ended");
    CHECK(cu.StreamSynchronize(a));
}

/* A per-thread default stream under a suspension: its thread makes its stream's queue (kernel
 * 21) before the test holds the device, then launches kernel 22 on it, which must not reach the
 * driver while the process is suspended. The launch waits on its own thread (only that thread
 * can name the stream), so the program sees a slow launch, never a reordered one. */
static volatile int pt_ready, pt_go, pt_launched;

static void *per_thread_worker(void *arg) {
    (void)arg;
    thread_setup();
    K(CU_STREAM_PER_THREAD, 21, 100, 0, 0);
    CHECK(cu.StreamSynchronize(CU_STREAM_PER_THREAD));
    pt_ready = 1;
    while (!pt_go) usleep(1000);
    K(CU_STREAM_PER_THREAD, 22, 100, 0, 0);
    pt_launched = 1;
    CHECK(cu.StreamSynchronize(CU_STREAM_PER_THREAD));
    EXPECT(cu.state(22) == DONE, "the per-thread stream's synchronize returned before kernel 22 ran");
    return NULL;
}

void per_thread_held(void) {
    pthread_t t;
    pthread_create(&t, NULL, per_thread_worker, NULL);
    while (!pt_ready) usleep(1000);
    say("@ready");
    expect_line("go");
    pt_go = 1;
    usleep(50000);
    say("@blocked");
    expect_line("check");
    if (under_shim) {
        EXPECT(!pt_launched, "a launch on the suspended per-thread stream returned");
        EXPECT(cu.state(22) == ABSENT, "a suspended per-thread stream's kernel reached the driver");
    }
    say("@checked");
    expect_line("finish");
    pthread_join(t, NULL);
    EXPECT(pt_launched && cu.state(22) == DONE, "kernel 22 never ran");
}
