/* The orderings CUDA defines between streams and for synchronous calls, with the earlier work
 * held in the shim's buffer: the legacy default stream and blocking streams wait for each other
 * (non-blocking streams do not), per-thread default streams pass through but follow the legacy
 * stream, and synchronous copies and sets, frees, unloads and context teardown come after
 * everything launched before them. Each case puts a gated kernel first so that what follows it
 * on that stream waits in the shim (XPREEMPT_WINDOW=1); a helper thread opens the gate (before
 * any call that the shim makes wait for that stream: see gate.c). */
#include "cu.h"
#include "scenarios.h"

void legacy_blocking(void) {
    CUstream a = new_stream(0);
    /* A blocking stream's buffered work, then the legacy stream (both of its names). */
    CUstream legacy[2] = {0, CU_STREAM_LEGACY};
    for (long i = 0; i < 2; i++) {
        long base = 10 * (i + 1);
        K(a, base, 0, F_GATE, 0);
        K(a, base + 1, 1000, 0, 0);
        release_after(base, 10);
        K(legacy[i], base + 2, 0, 0, 0);
        CHECK(cu.StreamSynchronize(legacy[i]));
        EXPECT(cu.before(base + 1, base + 2), "the legacy stream's kernel %ld ran before blocking kernel %ld ended", base + 2, base + 1);
    }
    /* The legacy stream's buffered work, then a blocking stream. */
    K(0, 30, 0, F_GATE, 0);
    K(0, 31, 1000, 0, 0);
    release_after(30, 10);
    K(a, 32, 0, 0, 0);
    CHECK(cu.StreamSynchronize(a));
    EXPECT(cu.before(31, 32), "blocking kernel 32 ran before the legacy stream's kernel 31 ended");
    /* Rounds across two blocking streams and the legacy stream. */
    CUstream b = new_stream(0);
    CUstream order[4] = {a, 0, b, CU_STREAM_LEGACY};
    for (long round = 0; round < 25; round++) {
        long base = 100 + 10 * round;
        for (long j = 0; j < 4; j++) K(order[j], base + j, 150 * (j % 2 ? 1 : 3), 0, 0);
    }
    CHECK(cu.CtxSynchronize());
    for (long round = 0; round < 25; round++) {
        long base = 100 + 10 * round;
        for (long j = 0; j < 3; j++)
            EXPECT(cu.before(base + j, base + j + 1), "kernel %ld ran before kernel %ld ended", base + j + 1, base + j);
    }
}

/* Blocking streams and the legacy stream in many rounds, kernels long enough that the local
 * scheduler's 5 ms turns between the active streams expire while they run. */
void rotation(void) {
    CUstream s[4];
    for (int i = 0; i < 4; i++) s[i] = new_stream(0);
    for (long round = 0; round < 40; round++) {
        long base = 100 + 10 * round;
        for (long i = 0; i < 4; i++) K(s[i], base + i, 300 + 300 * i, 0, 0);
        K(0, base + 5, 100, 0, 0);
        if (round % 4 != 3) continue;
        CHECK(cu.CtxSynchronize());
        for (long r = round - 3; r <= round; r++)
            for (long i = 0; i < 6; i++)
                if (i != 4) EXPECT(cu.state(100 + 10 * r + i) == DONE, "cuCtxSynchronize returned before kernel %ld ran", 100 + 10 * r + i);
    }
}

void nonblocking_exempt(void) {
    CUstream n = new_stream(CU_STREAM_NON_BLOCKING), n2 = new_stream(CU_STREAM_NON_BLOCKING);
    /* The legacy stream does not wait for a non-blocking stream: its kernel runs while the
     * non-blocking stream's gated kernel (and what the shim holds behind it) still waits. The
     * gated kernel cannot end before its release; under random suspensions it may not even have
     * reached the device yet, so the check is that it has not ended. */
    K(n, 1, 0, F_GATE, 0);
    K(n, 2, 0, 0, 0);
    K(0, 3, 0, 0, 0);
    CHECK(cu.StreamSynchronize(0));
    EXPECT(cu.state(3) == DONE && cu.state(1) != DONE, "the legacy stream waited for a non-blocking stream");
    /* Nor does a non-blocking stream wait for the legacy stream. */
    K(0, 4, 0, F_GATE, 0);
    K(0, 5, 0, 0, 0);
    K(n2, 6, 0, 0, 0);
    CHECK(cu.StreamSynchronize(n2));
    EXPECT(cu.state(6) == DONE && cu.state(4) != DONE, "a non-blocking stream waited for the legacy stream");
    cu.release(1);
    cu.release(4);
    CHECK(cu.CtxSynchronize());
    EXPECT(cu.state(2) == DONE && cu.state(5) == DONE, "work behind the gates did not run");
}

void per_thread(void) {
    unsigned long long launches = shim_launches();
    /* The per-thread default stream (by the _ptsz entry point and by CU_STREAM_PER_THREAD)
     * follows the legacy stream's buffered work, and has a queue of its own. */
    K(0, 1, 0, F_GATE, 0);
    K(0, 2, 1000, 0, 0);
    release_after(1, 10);
    unsigned long long before = shim_launches();
    CHECK(launch_pt(0, 3, 0));
    if (under_shim) EXPECT(shim_launches() == before + 1, "a per-thread default stream launch passed its queue");
    CHECK(cu.StreamSynchronize_pt(0));
    EXPECT(cu.before(2, 3), "the per-thread stream's kernel ran before the legacy stream's kernel 2 ended");
    K(0, 4, 0, F_GATE, 0);
    K(0, 5, 1000, 0, 0);
    release_after(4, 10);
    K(CU_STREAM_PER_THREAD, 6, 0, 0, 0);
    CHECK(cu.StreamSynchronize(CU_STREAM_PER_THREAD));
    EXPECT(cu.before(5, 6), "the per-thread stream's kernel ran before the legacy stream's kernel 5 ended");
    /* And the legacy stream follows the per-thread stream. */
    CHECK(launch_pt(0, 7, 2000));
    K(0, 8, 0, 0, 0);
    CHECK(cu.StreamSynchronize(0));
    EXPECT(cu.before(7, 8), "the legacy stream's kernel ran before the per-thread stream's kernel ended");
    EXPECT(cu.StreamQuery_pt(0) == 0, "the idle per-thread stream is not done");
    /* Kernels 1, 2, 4, 5 and 8 went through the legacy stream's queue; 3, 6 and 7 through the
     * per-thread stream's. */
    if (under_shim) EXPECT(shim_launches() - launches == 8, "%llu launches were queued, not 8", shim_launches() - launches);
}

void sync_memory(void) {
    CUstream a = new_stream(0);
    CUdeviceptr x;
    CHECK(cu.MemAlloc(&x, 8));
    unsigned long long h = 0;
    /* A synchronous copy comes after the blocking stream's buffered kernel. */
    K(a, 1, 0, F_GATE, x);
    K(a, 2, 1000, 0, x);
    release_after(1, 10);
    CHECK(cu.MemcpyDtoH(&h, x, 8));
    EXPECT(h == 2, "cuMemcpyDtoH read %llu: it overtook the buffered kernel 2", h);
    /* A synchronous set too (asynchronous to the host, on the legacy stream). */
    K(a, 3, 0, F_GATE, x);
    K(a, 4, 1000, 0, x);
    release_after(3, 10);
    CHECK(cu.MemsetD32(x, 7, 2));
    CHECK(cu.MemcpyDtoH(&h, x, 8));
    EXPECT(h == 0x0000000700000007ull, "cuMemsetD32 overtook the buffered kernel 4 (read %llx)", h);
    /* And a synchronous copy to the device. */
    K(a, 5, 0, F_GATE, x);
    K(a, 6, 1000, 0, x);
    release_after(5, 10);
    unsigned long long v = 99;
    CHECK(cu.MemcpyHtoD(x, &v, 8));
    CHECK(cu.MemcpyDtoH(&h, x, 8));
    EXPECT(h == 99, "cuMemcpyHtoD overtook the buffered kernel 6 (read %llu)", h);
    /* An asynchronous copy on the stream itself. */
    K(a, 7, 0, F_GATE, x);
    K(a, 8, 1000, 0, x);
    release_after(7, 10);
    CHECK(cu.MemcpyDtoHAsync(&h, x, 8, a));
    CHECK(cu.StreamSynchronize(a));
    EXPECT(h == 8, "cuMemcpyDtoHAsync overtook the buffered kernel 8 (read %llu)", h);
    /* A synchronous copy of the per-thread default stream, after the legacy stream's work. */
    K(0, 9, 0, F_GATE, x);
    K(0, 10, 1000, 0, x);
    release_after(9, 10);
    CHECK(cu.MemcpyDtoH_pt(&h, x, 8));
    EXPECT(h == 10, "cuMemcpyDtoH (per-thread) overtook the legacy stream's buffered kernel 10 (read %llu)", h);
}

void free_memory(void) {
    CUstream a = new_stream(0), n = new_stream(CU_STREAM_NON_BLOCKING);
    CUdeviceptr x, y;
    CHECK(cu.MemAlloc(&x, 8));
    CHECK(cu.MemAlloc(&y, 8));
    K(a, 1, 0, F_GATE, 0);
    K(a, 2, 1000, 0, x);
    K(n, 3, 0, F_GATE, 0);
    K(n, 4, 1000, 0, y);
    release_after(1, 10);
    release_after(3, 10);
    CHECK(cu.MemFree(x));
    CHECK(cu.MemFree(y));
    EXPECT(cu.state(2) == DONE && cu.state(4) == DONE, "memory was freed before the kernels using it ran");
}

void unload(void) {
    CUstream a = new_stream(0);
    CUmodule m;
    CUfunction f;
    CHECK(cu.ModuleLoadData(&m, "image"));
    CHECK(cu.ModuleGetFunction(&f, m, "kernel"));
    K(a, 1, 0, F_GATE, 0);
    CHECK(launch_fn(f, a, 2, 1000, 0, 0));
    release_after(1, 10);
    CHECK(cu.ModuleUnload(m));
    EXPECT(cu.state(2) == DONE, "the module was unloaded before its buffered kernel ran");
    void *lib, *k;
    CHECK(cu.LibraryLoadData(&lib, "code", 0, 0, 0, 0, 0, 0));
    CHECK(cu.LibraryGetKernel(&k, lib, "kernel"));
    K(a, 3, 0, F_GATE, 0);
    CHECK(launch_fn(k, a, 4, 1000, 0, 0));
    release_after(3, 10);
    CHECK(cu.LibraryUnload(lib));
    EXPECT(cu.state(4) == DONE, "the library was unloaded before its buffered kernel ran");
}

void ctx_teardown(void) {
    /* A context of its own, destroyed with work buffered on a stream and its legacy stream. */
    CUcontext c;
    CHECK(cu.CtxCreate(&c, 0, 0));
    CUstream a = new_stream(0);
    K(a, 1, 0, F_GATE, 0);
    K(a, 2, 1000, 0, 0);
    release_after(1, 10);
    K(0, 3, 500, 0, 0);
    K(0, 4, 0, 0, 0);
    CHECK(cu.CtxDestroy(c));
    for (long id = 1; id <= 4; id++) EXPECT(cu.state(id) == DONE, "kernel %ld did not run before its context was destroyed", id);
    CHECK(cu.CtxSetCurrent(primary));
    /* The primary context, reset with buffered work; then retained again. */
    CUstream b = new_stream(0);
    K(b, 5, 0, F_GATE, 0);
    K(b, 6, 1000, 0, 0);
    release_after(5, 10);
    K(0, 7, 0, 0, 0);
    CHECK(cu.DevicePrimaryCtxReset(0));
    for (long id = 5; id <= 7; id++) EXPECT(cu.state(id) == DONE, "kernel %ld did not run before the primary context was reset", id);
    use_primary();
    CUstream d = new_stream(0);
    K(d, 8, 0, F_GATE, 0);
    K(d, 9, 1000, 0, 0);
    release_after(8, 10);
    /* The last release of the primary context destroys it. */
    CHECK(cu.DevicePrimaryCtxRelease(0));
    EXPECT(cu.state(9) == DONE, "kernel 9 did not run before the primary context was released");
}
