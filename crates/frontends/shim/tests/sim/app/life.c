/* Lifecycle with work held by the shim: a stream destroyed with buffered work, a process that
 * exits without synchronizing, a fork after CUDA is initialized (the child passes through and
 * launches nothing of the parent's), and an error of a buffered launch (reported at the stream's
 * next synchronize). */
#include "cu.h"
#include "scenarios.h"
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

void stream_destroy(void) {
    CUstream a = new_stream(0);
    K(a, 1, 0, F_GATE, 0);
    K(a, 2, 1000, 0, 0);
    K(a, 3, 0, 0, 0);
    release_after(1, 10);
    CHECK(cu.StreamDestroy(a));
    /* Many streams, each destroyed right after its launches (3: not a multiple of any batch). */
    for (long i = 0; i < 20; i++) {
        CUstream s = new_stream(i % 2 ? CU_STREAM_NON_BLOCKING : 0);
        for (long j = 0; j < 3; j++) K(s, 100 + 10 * i + j, 200, 0, 0);
        CHECK(cu.StreamDestroy(s));
    }
    CHECK(cu.CtxSynchronize());
    for (long id = 1; id <= 3; id++) EXPECT(cu.state(id) == DONE, "kernel %ld of a destroyed stream did not run", id);
    for (long i = 0; i < 20; i++)
        for (long j = 0; j < 3; j++)
            EXPECT(cu.state(100 + 10 * i + j) == DONE, "kernel %ld of a destroyed stream did not run", 100 + 10 * i + j);
}

void exit_pending(void) {
    CUstream a = new_stream(0), b = new_stream(CU_STREAM_NON_BLOCKING);
    for (long j = 0; j < 10; j++) K(a, 1 + j, j ? 100 : 30000, 0, 0);
    for (long j = 0; j < 10; j++) K(b, 101 + j, j ? 100 : 30000, 0, 0);
    for (long j = 0; j < 5; j++) K(0, 201 + j, 100, 0, 0);
    /* No synchronize: main returns, and the exit handlers run. */
}

void fork_child(void) {
    CUstream a = new_stream(0);
    K(a, 1, 0, F_GATE, 0);
    K(a, 2, 1000, 0, 0);
    unsigned long long launches = shim_launches();
    pid_t pid = fork();
    EXPECT(pid >= 0, "fork failed");
    if (pid == 0) {
        /* The watchdog thread is the parent's: a hung child ends by the alarm. */
        alarm(30);
        /* The child's CUDA calls reach the driver as made (which refuses them: its context is
         * the parent's) without waiting for the parent's queues. */
        CUresult r = launch(a, 900, 0, 0, 0);
        EXPECT(r == NOT_INITIALIZED, "the child's launch returned %d, not the driver's answer", r);
        EXPECT((r = cu.StreamQuery(a)) == NOT_INITIALIZED, "the child's stream query returned %d", r);
        EXPECT((r = cu.StreamSynchronize(a)) == NOT_INITIALIZED, "the child's stream synchronize returned %d", r);
        EXPECT((r = cu.CtxSynchronize()) == NOT_INITIALIZED, "the child's context synchronize returned %d", r);
        EXPECT(shim_launches() == launches, "the child's launch went through a queue");
        exit(0);
    }
    int status = 0;
    EXPECT(waitpid(pid, &status, 0) == pid, "waitpid");
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed (status %d)", status);
    cu.release(1);
    CHECK(cu.StreamSynchronize(a));
    EXPECT(cu.runs(1) == 1 && cu.runs(2) == 1, "the parent's kernels ran %ld and %ld times", cu.runs(1), cu.runs(2));
    K(a, 3, 0, 0, 0);
    CHECK(cu.StreamSynchronize(a));
}

void sticky_error(void) {
    CUstream a = new_stream(0);
    int buffered = 0;
    for (long round = 0; round < 10; round++) {
        long base = 10 * (round + 1);
        K(a, base, 0, F_GATE, 0);
        CUresult r = launch(a, base + 1, 0, F_REFUSE, 0);
        K(a, base + 2, 500, 0, 0);
        cu.release(base);
        if (r == 0) {
            /* The launch waited in the shim and the driver refused it later: the stream's next
             * synchronize reports it, once; the work after it still runs. */
            buffered++;
            CUresult s = cu.StreamSynchronize(a);
            EXPECT(s == LAUNCH_OUT_OF_RESOURCES, "the synchronize after a refused buffered launch returned %d", s);
        } else {
            EXPECT(r == LAUNCH_OUT_OF_RESOURCES, "the refused launch returned %d", r);
        }
        CHECK(cu.StreamSynchronize(a));
        EXPECT(cu.state(base + 2) == DONE, "kernel %ld after the refused launch did not run", base + 2);
    }
    printf("sticky buffered=%d\n", buffered);
}

/* The same refused buffered launch, with the application checking for errors the two other ways
 * it commonly does: a context synchronize (cudaDeviceSynchronize), and polling the stream with
 * cuStreamQuery. Natively the launch itself returns the error. */
void sticky_elsewhere(void) {
    CUstream a = new_stream(0);
    int buffered = 0;
    for (long round = 0; round < 4; round++) {
        long base = 10 * (round + 1);
        K(a, base, 0, F_GATE, 0);
        CUresult r = launch(a, base + 1, 0, F_REFUSE, 0);
        K(a, base + 2, 500, 0, 0);
        cu.release(base);
        if (r) {
            EXPECT(r == LAUNCH_OUT_OF_RESOURCES, "the refused launch returned %d", r);
            CHECK(cu.CtxSynchronize());
            continue;
        }
        buffered++;
        CUresult s;
        if (round % 2 == 0) {
            s = cu.CtxSynchronize();
            EXPECT(s == LAUNCH_OUT_OF_RESOURCES, "cuCtxSynchronize after a refused buffered launch returned %d", s);
        } else {
            while ((s = cu.StreamQuery(a)) == NOT_READY) sleep_ms(1);
            EXPECT(s == LAUNCH_OUT_OF_RESOURCES, "cuStreamQuery after a refused buffered launch returned %d", s);
        }
        CHECK(cu.StreamSynchronize(a));
        EXPECT(cu.state(base + 2) == DONE, "kernel %ld after the refused launch did not run", base + 2);
    }
    printf("sticky buffered=%d\n", buffered);
}

/* cudaDeviceReset as the CUDA 13.0 runtime (linked statically) makes it: through libcuda's first
 * version of cuDevicePrimaryCtxReset, which it asks cuGetProcAddress for at version 7000, with
 * work in flight and buffered on a stream and on the legacy stream. That work runs before the
 * context goes, nothing touches the context's events or streams afterwards (the simulated driver
 * logs such a use as a violation), CUDA works again, and the runtime's exit handler releases the
 * primary context through the first version as well. */
void runtime_reset(void) {
    CUstream a = new_stream(CU_STREAM_NON_BLOCKING);
    K(a, 1, 0, F_GATE, 0);
    for (long id = 2; id <= 6; id++) K(a, id, 300, 0, 0);
    release_after(1, 10);
    K(0, 7, 500, 0, 0);
    CHECK(cu.DevicePrimaryCtxReset_rt(0));
    for (long id = 1; id <= 7; id++) EXPECT(cu.state(id) == DONE, "kernel %ld did not run before the device reset", id);
    /* Time for a completion watcher that outlived the reset to poll its events. */
    sleep_ms(20);
    use_primary();
    CUstream b = new_stream(0);
    K(b, 8, 0, F_GATE, 0);
    for (long id = 9; id <= 12; id++) K(b, id, 300, 0, 0);
    release_after(8, 10);
    CHECK(cu.StreamSynchronize(b));
    K(b, 13, 300, 0, 0);
    CHECK(cu.DevicePrimaryCtxRelease_rt(0));
    EXPECT(cu.state(13) == DONE, "kernel 13 did not run before the primary context was released");
    sleep_ms(20);
}
