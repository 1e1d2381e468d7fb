/* The test application's view of CUDA: entry points found as the CUDA runtime finds them
 * (dlopen libcuda.so.1, dlsym cuGetProcAddress_v2, every entry point through it, the per-thread
 * variants with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, the primary context's release and
 * reset also at the old version the CUDA 13.0 runtime asks for), the simulated device's sim_*
 * inspection calls, and helpers shared by the scenarios. */
#ifndef CU_H
#define CU_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUcontext;
typedef void *CUfunction;
typedef void *CUmodule;
typedef unsigned long long CUdeviceptr;

#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
#define CU_STREAM_NON_BLOCKING 1u
#define NOT_READY 600
#define LAUNCH_OUT_OF_RESOURCES 701
#define NOT_INITIALIZED 3
#define MODE_GLOBAL 0
#define MODE_THREAD_LOCAL 1
#define MODE_RELAXED 2

/* Kernel flags (see the driver's sim.h). */
#define F_GATE 1ul
#define F_REFUSE 2ul
#define POISON 0x5a5a5a5a5a5a5a5aLL

/* sim_state: never reached the driver, or queued, running, done on the device. */
#define ABSENT (-1)
#define QUEUED 0
#define RUNNING 1
#define DONE 2

struct cu {
    CUresult (*Init)(unsigned);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, int);
    CUresult (*DevicePrimaryCtxRelease)(int);
    CUresult (*DevicePrimaryCtxReset)(int);
    CUresult (*CtxCreate)(CUcontext *, unsigned, int);
    CUresult (*CtxDestroy)(CUcontext);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxSynchronize)(void);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamQuery)(CUstream);
    CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned);
    CUresult (*StreamBeginCapture)(CUstream, int);
    CUresult (*StreamEndCapture)(CUstream, void **);
    CUresult (*ThreadExchangeStreamCaptureMode)(int *);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventQuery)(CUevent);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*LaunchHostFunc)(CUstream, void (*)(void *), void *);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*MemsetD32)(CUdeviceptr, unsigned, size_t);
    CUresult (*MemsetD32Async)(CUdeviceptr, unsigned, size_t, CUstream);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*ModuleUnload)(CUmodule);
    CUresult (*LibraryLoadData)(void **, const void *, void *, void **, unsigned, void *, void **, unsigned);
    CUresult (*LibraryGetKernel)(void **, void *, const char *);
    CUresult (*LibraryUnload)(void *);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
    CUresult (*LaunchKernelEx)(const void *, CUfunction, void **, void **);
    CUresult (*GraphInstantiate)(void **, void *, unsigned long long);
    CUresult (*GraphLaunch)(void *, CUstream);
    /* Per-thread default stream variants (what nvcc --default-stream per-thread gets). */
    CUresult (*LaunchKernel_pt)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                CUstream, void **, void **);
    CUresult (*StreamSynchronize_pt)(CUstream);
    CUresult (*StreamQuery_pt)(CUstream);
    CUresult (*MemcpyDtoH_pt)(void *, CUdeviceptr, size_t);
    /* As the CUDA 13.0 runtime asks for them (version 7000): libcuda's first versions. */
    CUresult (*DevicePrimaryCtxRelease_rt)(int);
    CUresult (*DevicePrimaryCtxReset_rt)(int);
    /* The simulated device. */
    int (*state)(long id);
    int (*before)(long a, long b);
    long (*runs)(long id);
    long (*stops)(long id);
    void (*release)(long id);
};

extern struct cu cu;
extern CUcontext primary;
extern CUfunction kern;
/* Set by the test when the shim intercepts (XPREEMPT_INTERCEPT=1): shim-only checks apply. */
extern int under_shim;
extern const char *scenario;

/* Loads everything, retains the primary context and makes it current, gets a kernel. */
void setup(void);
/* Retains the primary context (again, after a reset or release), makes it current, gets a
 * kernel of it. */
void use_primary(void);
/* Makes the primary context current on a new thread. */
void thread_setup(void);
CUstream new_stream(unsigned flags);

/* Launches the simulated kernel (id, runs us, flags, writes id to ptr at its end), then
 * overwrites its argument copies: the driver must see what the call was made with. */
CUresult launch(CUstream s, long id, long us, unsigned long flags, CUdeviceptr ptr);
CUresult launch_fn(CUfunction f, CUstream s, long id, long us, unsigned long flags, CUdeviceptr ptr);
/* The same through CU_LAUNCH_PARAM_BUFFER_POINTER, cuLaunchKernelEx, the per-thread variant. */
CUresult launch_extra(CUstream s, long id, long us);
CUresult launch_ex(CUstream s, long id, long us);
CUresult launch_pt(CUstream s, long id, long us);
/* launch(), failing the scenario unless the driver (or the shim) accepted it. */
void K(CUstream s, long id, long us, unsigned long flags, CUdeviceptr ptr);

/* Opens the gate of kernel id after ms milliseconds, from another thread. */
void release_after(long id, int ms);
void sleep_ms(int ms);

/* The shim's counters (0 without the shim). */
unsigned long long shim_launches(void);
unsigned long long shim_buffered(void);
/* A counter the shim exports (0 without the shim). */
unsigned long long shim_counter(const char *name);

/* Fails the scenario with a message. */
void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_) fail("%s returned %d", #call, r_);                                                 \
    } while (0)
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) fail(__VA_ARGS__);                                                            \
    } while (0)

/* Polls until kernel id is in state st (fails after a generous time). */
void await_state(long id, int st);
/* Reads stdin up to a line equal to want (the test's answer in a protocol step). */
void expect_line(const char *want);
/* Writes a protocol line to stdout. */
void say(const char *line);

#endif
