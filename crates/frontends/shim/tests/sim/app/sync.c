/* Synchronization and queries must account for commands the shim still holds: a stream, context
 * or event synchronize returns only after they ran, and a query says "done" only when they are.
 *
 * Under XPREEMPT_WINDOW=1 a gated kernel keeps the window full, so the kernels after it are
 * buffered for certain; the rounds of short kernels that follow give suspensions (random ones
 * under XPREEMPT_CHAOS, and the local scheduler's turns between active streams) a chance. */
#include "cu.h"
#include "scenarios.h"

/* Polls cuStreamQuery until it says done, which it may only say once `last` has run. */
static void query_until_done(CUresult (*query)(CUstream), CUstream s, long last) {
    for (long i = 0;; i++) {
        CUresult r = query(s);
        if (r == 0) {
            EXPECT(cu.state(last) == DONE, "cuStreamQuery said done while kernel %ld is in state %d",
                   last, cu.state(last));
            return;
        }
        EXPECT(r == NOT_READY, "cuStreamQuery returned %d", r);
        EXPECT(i < 20000000, "cuStreamQuery never said done");
    }
}

void stream_sync(void) {
    CUstream a = new_stream(0);
    K(a, 1, 0, F_GATE, 0);
    K(a, 2, 1000, 0, 0);
    K(a, 3, 0, 0, 0);
    release_after(1, 20);
    CHECK(cu.StreamSynchronize(a));
    EXPECT(cu.state(3) == DONE, "cuStreamSynchronize returned before kernel 3 ran");
    for (long round = 0; round < 30; round++) {
        long base = 100 + 10 * round;
        for (long j = 0; j < 4; j++) K(a, base + j, 200, 0, 0);
        CHECK(cu.StreamSynchronize(a));
        EXPECT(cu.state(base + 3) == DONE, "cuStreamSynchronize returned before kernel %ld ran", base + 3);
    }
    /* The legacy default stream, by both of its names. */
    CUstream legacy[2] = {0, CU_STREAM_LEGACY};
    for (int i = 0; i < 2; i++) {
        long g = 1000 + 10 * i;
        K(legacy[i], g, 0, F_GATE, 0);
        K(legacy[i], g + 1, 500, 0, 0);
        release_after(g, 10);
        CHECK(cu.StreamSynchronize(legacy[i]));
        EXPECT(cu.state(g + 1) == DONE, "cuStreamSynchronize(legacy) returned before kernel %ld ran", g + 1);
    }
}

void stream_query(void) {
    CUstream a = new_stream(0);
    K(a, 1, 0, F_GATE, 0);
    K(a, 2, 2000, 0, 0);
    EXPECT(cu.StreamQuery(a) == NOT_READY, "cuStreamQuery said done with a kernel running");
    cu.release(1);
    query_until_done(cu.StreamQuery, a, 2);
    for (long round = 0; round < 40; round++) {
        long base = 100 + 10 * round;
        K(a, base, 300, 0, 0);
        K(a, base + 1, 300, 0, 0);
        K(a, base + 2, 0, 0, 0);
        query_until_done(cu.StreamQuery, a, base + 2);
    }
    for (long round = 0; round < 20; round++) {
        long base = 1000 + 10 * round;
        K(0, base, 300, 0, 0);
        K(0, base + 1, 0, 0, 0);
        query_until_done(cu.StreamQuery, round % 2 ? CU_STREAM_LEGACY : 0, base + 1);
    }
}

void ctx_sync(void) {
    CUstream a = new_stream(0), b = new_stream(CU_STREAM_NON_BLOCKING);
    K(a, 1, 0, F_GATE, 0);
    K(a, 2, 1000, 0, 0);
    K(b, 3, 0, F_GATE, 0);
    K(b, 4, 1000, 0, 0);
    /* Opened from another thread before the legacy stream's launch, which (under the shim) waits
     * until a's buffered kernel 2 reaches the driver (see the known limitation in gate.c). */
    release_after(1, 10);
    release_after(3, 15);
    K(0, 5, 500, 0, 0);
    CHECK(cu.CtxSynchronize());
    for (long id = 1; id <= 5; id++) EXPECT(cu.state(id) == DONE, "cuCtxSynchronize returned before kernel %ld ran", id);
    CUstream streams[3] = {a, b, 0};
    for (long round = 0; round < 20; round++) {
        long base = 100 + 10 * round;
        for (long j = 0; j < 6; j++) K(streams[(round + j) % 3], base + j, 150, 0, 0);
        CHECK(cu.CtxSynchronize());
        for (long j = 0; j < 6; j++)
            EXPECT(cu.state(base + j) == DONE, "cuCtxSynchronize returned before kernel %ld ran", base + j);
    }
}

void event_sync(void) {
    CUstream a = new_stream(0);
    CUevent ev;
    CHECK(cu.EventCreate(&ev, 0));
    K(a, 1, 0, F_GATE, 0);
    K(a, 2, 1500, 0, 0);
    release_after(1, 10);
    CHECK(cu.EventRecord(ev, a));
    CUresult r = cu.EventQuery(ev);
    EXPECT(r == NOT_READY || (r == 0 && cu.state(2) == DONE), "cuEventQuery returned %d with kernel 2 in state %d", r, cu.state(2));
    CHECK(cu.EventSynchronize(ev));
    EXPECT(cu.state(2) == DONE, "cuEventSynchronize returned before kernel 2 ran");
    for (long round = 0; round < 30; round++) {
        long base = 100 + 10 * round;
        K(a, base, 300, 0, 0);
        K(a, base + 1, 300, 0, 0);
        CHECK(cu.EventRecord(ev, round % 3 == 2 ? 0 : a));
        if (round % 2) {
            CHECK(cu.EventSynchronize(ev));
            EXPECT(cu.state(base + 1) == DONE, "cuEventSynchronize returned before kernel %ld ran", base + 1);
            continue;
        }
        for (long i = 0;; i++) {
            r = cu.EventQuery(ev);
            if (r == 0) break;
            EXPECT(r == NOT_READY, "cuEventQuery returned %d", r);
            EXPECT(i < 20000000, "cuEventQuery never said done");
        }
        EXPECT(cu.state(base + 1) == DONE, "cuEventQuery said done before kernel %ld ran", base + 1);
    }
}

void wait_event(void) {
    CUstream a = new_stream(CU_STREAM_NON_BLOCKING), b = new_stream(CU_STREAM_NON_BLOCKING);
    CUevent ev;
    CHECK(cu.EventCreate(&ev, 0));
    /* An earlier record of the same event, which the wait must not settle for. */
    K(a, 1, 200, 0, 0);
    CHECK(cu.EventRecord(ev, a));
    K(a, 2, 0, F_GATE, 0);
    K(a, 3, 3000, 0, 0);
    release_after(2, 10);
    CHECK(cu.EventRecord(ev, a));
    CHECK(cu.StreamWaitEvent(b, ev, 0));
    K(b, 4, 0, 0, 0);
    CHECK(cu.StreamSynchronize(b));
    EXPECT(cu.before(3, 4), "stream b did not wait for the event's latest record: kernel 4 ran before kernel 3 ended");
    /* Many rounds between two streams that the local scheduler takes turns with. */
    for (long round = 0; round < 40; round++) {
        long base = 100 + 10 * round;
        K(a, base, 400, 0, 0);
        K(a, base + 1, 200, 0, 0);
        CHECK(cu.EventRecord(ev, a));
        CHECK(cu.StreamWaitEvent(b, ev, 0));
        K(b, base + 2, 0, 0, 0);
    }
    CHECK(cu.StreamSynchronize(b));
    for (long round = 0; round < 40; round++) {
        long base = 100 + 10 * round;
        EXPECT(cu.before(base + 1, base + 2), "kernel %ld ran before kernel %ld, whose event it waited for", base + 2, base + 1);
    }
    CHECK(cu.StreamSynchronize(a));
}
