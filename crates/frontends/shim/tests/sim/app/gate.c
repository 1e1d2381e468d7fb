/* A known limitation: the shim keeps CUDA's order by making a call wait (on the host) until the
 * buffered commands it must follow have reached the driver. Natively such a call returns at
 * once. If one of the commands in flight before the buffered ones waits for something the host
 * does only after that call (here a gated kernel whose gate the application opens afterwards;
 * on a GPU, a kernel polling a flag the host sets, or cuStreamWaitValue32), the host waits for
 * the device and the device for the host. The scenarios end by themselves (a short watchdog). */
#include "cu.h"
#include "scenarios.h"

void gate_legacy(void) {
    CUstream a = new_stream(0);
    K(a, 1, 0, F_GATE, 0);
    K(a, 2, 0, 0, 0);
    /* Natively asynchronous; under the shim it waits for kernel 2 to reach the driver. */
    K(0, 3, 0, 0, 0);
    cu.release(1);
    CHECK(cu.CtxSynchronize());
}

void gate_record(void) {
    CUstream a = new_stream(0);
    CUevent ev;
    CHECK(cu.EventCreate(&ev, 0));
    K(a, 1, 0, F_GATE, 0);
    K(a, 2, 0, 0, 0);
    CHECK(cu.EventRecord(ev, a));
    cu.release(1);
    CHECK(cu.EventSynchronize(ev));
}

/* Not that limitation: a launch on the legacy stream behind buffered commands of its own
 * stream does not wait for them (tests/pending/order.rs). */
void gate_own_legacy(void) {
    K(0, 1, 0, F_GATE, 0);
    K(0, 2, 0, 0, 0);
    K(0, 3, 0, 0, 0);
    cu.release(1);
    CHECK(cu.CtxSynchronize());
}

/* An asynchronous set on a stream is buffered behind the stream's buffered kernel like a launch:
 * the call returns at once, as natively (the gate opens only after it), and the set still comes
 * after kernel 2. */
void gate_set_async(void) {
    CUstream a = new_stream(0);
    CUdeviceptr x;
    CHECK(cu.MemAlloc(&x, 8));
    K(a, 1, 0, F_GATE, x);
    K(a, 2, 1000, 0, x);
    CHECK(cu.MemsetD32Async(x, 7, 2, a));
    cu.release(1);
    CHECK(cu.StreamSynchronize(a));
    unsigned long long h = 0;
    CHECK(cu.MemcpyDtoH(&h, x, 8));
    EXPECT(h == 0x0000000700000007ull, "cuMemsetD32Async overtook kernel 2 (read %llx)", h);
}
