/* Priority inheritance between a process's own streams, under a real xpreemptd: the operator
 * lowered the queue of blocking stream `b` below a third process (`hold`, which keeps the device
 * with a gated kernel), so b's next kernel waits in the shim's buffer. A launch on the legacy
 * stream, which CUDA orders after that kernel, waits for it on behalf of the process's own
 * priority (above the holder's): b's queue inherits that priority, runs, and the launch returns
 * while the holder still holds. Without inheritance the launch would wait for the holder, which
 * outranks b but not the launching stream. */
#include "cu.h"
#include "scenarios.h"

void inherit(void) {
    CUstream b = new_stream(0);
    K(b, 41, 100, 0, 0);
    CHECK(cu.StreamSynchronize(b));
    say("@ready");
    /* The test lowers b's queue, then has the holder hold the device: b is suspended. */
    expect_line("go");
    unsigned long long buffered = shim_buffered();
    K(b, 42, 100, 0, 0);
    if (under_shim) {
        EXPECT(shim_buffered() - buffered == 1, "the launch on the suspended stream was not buffered");
        EXPECT(cu.state(42) == ABSENT, "a suspended queue's kernel reached the driver");
    }
    /* The legacy stream follows b's kernel 42: its launch waits until 42 is launched. */
    K(0, 43, 100, 0, 0);
    say("@launched");
    expect_line("finish");
    CHECK(cu.CtxSynchronize());
    EXPECT(cu.before(42, 43), "legacy kernel 43 ran before blocking kernel 42 ended");
}
