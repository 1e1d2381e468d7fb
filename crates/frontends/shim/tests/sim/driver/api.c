/* The simulated driver's contexts, streams, events, memory and synchronization entry points,
 * under libcuda's names (each a distinct export, so the shim can tell them apart by address). */
#define _GNU_SOURCE
#include "sim.h"
#include <stdlib.h>
#include <string.h>

#define PER_THREAD_MAX 16

static struct stream *streams;
static int nstreams, nctxs, nevents;
static struct ctx *primary;
static int primary_refs;

static __thread struct ctx *ctx_stack[16];
static __thread int ctx_depth;
static __thread struct {
    struct ctx *ctx;
    struct stream *s;
} per_thread_streams[PER_THREAD_MAX];
static __thread int n_per_thread;
/* This thread's stream capture interaction mode (cuThreadExchangeStreamCaptureMode). */
static __thread int thread_mode = MODE_GLOBAL;

struct stream *stream_list(void) { return streams; }

struct ctx *current_ctx(void) { return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL; }

static struct stream *new_stream(struct ctx *x, int kind, unsigned flags) {
    struct stream *s = calloc(1, sizeof *s);
    s->magic = MAGIC_STREAM;
    s->id = ++nstreams;
    s->kind = kind;
    s->flags = flags;
    s->ctx = x;
    s->next_all = streams;
    streams = s;
    return s;
}

static struct ctx *new_ctx(int is_primary) {
    struct ctx *x = calloc(1, sizeof *x);
    x->id = ++nctxs;
    x->primary = is_primary;
    x->legacy = new_stream(x, S_LEGACY, 0);
    return x;
}

static struct stream *per_thread(struct ctx *x) {
    for (int i = 0; i < n_per_thread; i++)
        if (per_thread_streams[i].ctx == x) return per_thread_streams[i].s;
    struct stream *s = new_stream(x, S_PER_THREAD, 0);
    if (n_per_thread < PER_THREAD_MAX) {
        per_thread_streams[n_per_thread].ctx = x;
        per_thread_streams[n_per_thread++].s = s;
    }
    return s;
}

struct stream *resolve(void *h, int ptsz, CUresult *err) {
    uintptr_t v = (uintptr_t)h;
    if (v <= 2) {
        struct ctx *x = current_ctx();
        if (!x || x->dead) {
            if (x) sim_log("violation a default stream of a destroyed context was used");
            *err = E_INVALID_CONTEXT;
            return NULL;
        }
        return v == 2 || (v == 0 && ptsz) ? per_thread(x) : x->legacy;
    }
    struct stream *s = h;
    if (s->magic != MAGIC_STREAM) {
        *err = E_INVALID_HANDLE;
        return NULL;
    }
    if (s->dead || s->ctx->dead) {
        sim_log("violation stream %d used after it was destroyed", s->id);
        *err = E_INVALID_HANDLE;
        return NULL;
    }
    return s;
}

int capture_forbids(const char *call) {
    if (thread_mode == MODE_RELAXED) return 0;
    long me = sim_tid();
    int hit = 0;
    for (struct stream *s = streams; s; s = s->next_all) {
        if (!s->capturing) continue;
        if ((s->capture_tid == me && s->mode != MODE_RELAXED) ||
            (thread_mode == MODE_GLOBAL && s->mode == MODE_GLOBAL && s->capture_tid != me)) {
            s->invalidated = 1;
            hit = 1;
        }
    }
    if (hit) sim_log("capture-error %s", call);
    return hit;
}

struct stream *implicit_capture(struct stream *s) {
    if (s->kind != S_LEGACY) return NULL;
    for (struct stream *t = streams; t; t = t->next_all)
        if (t->capturing && t->ctx == s->ctx && t->kind != S_LEGACY &&
            !(t->flags & STREAM_NON_BLOCKING))
            return t;
    return NULL;
}

/* ---- device and contexts ---- */

CUresult cuInit(unsigned flags) {
    (void)flags;
    ENTER("cuInit");
    sim_start();
    return OK;
}
CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
CUresult cuDeviceGet(int *d, int ordinal) {
    ENTER("cuDeviceGet");
    if (ordinal != 0) return 101;
    *d = 0;
    return OK;
}
CUresult cuDeviceGetCount(int *n) { *n = 1; return OK; }

static void destroy_ctx(struct ctx *x) {
    /* Like the real driver, destroying a context waits for its work. */
    wait_ctx(x);
    x->dead = 1;
    for (struct stream *s = streams; s; s = s->next_all)
        if (s->ctx == x) s->dead = 1;
    if (ctx_depth && ctx_stack[ctx_depth - 1] == x) ctx_depth--;
    sim_log("ctx-destroyed ctx=%d", x->id);
}

CUresult cuDevicePrimaryCtxRetain(void **out, int dev) {
    (void)dev;
    ENTER("cuDevicePrimaryCtxRetain");
    pthread_mutex_lock(&sim_lock);
    if (!primary || primary->dead) primary = new_ctx(1), primary_refs = 0;
    primary_refs++;
    *out = primary;
    pthread_mutex_unlock(&sim_lock);
    return OK;
}
static CUresult primary_release(const char *name) {
    ENTER(name);
    pthread_mutex_lock(&sim_lock);
    if (primary && !primary->dead && primary_refs > 0 && --primary_refs == 0) destroy_ctx(primary);
    pthread_mutex_unlock(&sim_lock);
    return OK;
}
static CUresult primary_reset(const char *name) {
    ENTER(name);
    pthread_mutex_lock(&sim_lock);
    if (primary && !primary->dead) destroy_ctx(primary);
    primary_refs = 0;
    pthread_mutex_unlock(&sim_lock);
    return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return primary_release("cuDevicePrimaryCtxRelease_v2"); }
CUresult cuDevicePrimaryCtxReset_v2(int dev) { (void)dev; return primary_reset("cuDevicePrimaryCtxReset_v2"); }
/* The first versions, still exported (separate functions, as in libcuda): what cuGetProcAddress
 * hands out for requests below version 11000, as the CUDA 13.0 runtime makes them. */
CUresult cuDevicePrimaryCtxRelease(int dev) { (void)dev; return primary_release("cuDevicePrimaryCtxRelease"); }
CUresult cuDevicePrimaryCtxReset(int dev) { (void)dev; return primary_reset("cuDevicePrimaryCtxReset"); }
CUresult cuCtxCreate_v2(void **out, unsigned flags, int dev) {
    (void)flags, (void)dev;
    ENTER("cuCtxCreate_v2");
    pthread_mutex_lock(&sim_lock);
    struct ctx *x = new_ctx(0);
    if (ctx_depth < 16) ctx_stack[ctx_depth++] = x;
    *out = x;
    pthread_mutex_unlock(&sim_lock);
    return OK;
}
CUresult cuCtxDestroy_v2(void *h) {
    ENTER("cuCtxDestroy_v2");
    struct ctx *x = h;
    pthread_mutex_lock(&sim_lock);
    CUresult r = x && !x->dead ? OK : E_INVALID_CONTEXT;
    if (r == OK) destroy_ctx(x);
    pthread_mutex_unlock(&sim_lock);
    return r;
}
CUresult cuCtxSetCurrent(void *h) {
    ENTER("cuCtxSetCurrent");
    if (!h) {
        if (ctx_depth) ctx_depth--;
    } else if (ctx_depth) {
        ctx_stack[ctx_depth - 1] = h;
    } else {
        ctx_stack[ctx_depth++] = h;
    }
    return OK;
}
CUresult cuCtxGetCurrent(void **out) {
    ENTER("cuCtxGetCurrent");
    *out = current_ctx();
    return OK;
}
CUresult cuCtxPushCurrent_v2(void *h) {
    ENTER("cuCtxPushCurrent_v2");
    if (!h || ctx_depth == 16) return E_INVALID_VALUE;
    if (((struct ctx *)h)->dead) {
        sim_log("violation a destroyed context was made current");
        return E_INVALID_CONTEXT;
    }
    ctx_stack[ctx_depth++] = h;
    return OK;
}
CUresult cuCtxPopCurrent_v2(void **out) {
    ENTER("cuCtxPopCurrent_v2");
    if (!ctx_depth) return E_INVALID_CONTEXT;
    struct ctx *x = ctx_stack[--ctx_depth];
    if (out) *out = x;
    return OK;
}
CUresult cuCtxGetDevice(int *d) {
    ENTER("cuCtxGetDevice");
    if (!current_ctx()) return E_INVALID_CONTEXT;
    *d = 0;
    return OK;
}
CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) {
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return OK;
}
CUresult cuCtxSynchronize(void) {
    ENTER("cuCtxSynchronize");
    pthread_mutex_lock(&sim_lock);
    struct ctx *x = current_ctx();
    CUresult r = !x || x->dead ? E_INVALID_CONTEXT : capture_forbids("cuCtxSynchronize") ? E_CAPTURE_UNSUPPORTED : OK;
    if (r == OK) wait_ctx(x);
    pthread_mutex_unlock(&sim_lock);
    return r;
}

/* ---- streams ---- */

static CUresult create(void **out, unsigned flags, int prio) {
    ENTER("cuStreamCreate");
    pthread_mutex_lock(&sim_lock);
    struct ctx *x = current_ctx();
    CUresult r = x && !x->dead ? OK : E_INVALID_CONTEXT;
    if (r == OK) {
        struct stream *s = new_stream(x, S_CREATED, flags);
        s->priority = prio;
        *out = s;
    }
    pthread_mutex_unlock(&sim_lock);
    return r;
}
CUresult cuStreamCreate(void **out, unsigned flags) { return create(out, flags, 0); }
CUresult cuStreamCreateWithPriority(void **out, unsigned flags, int prio) { return create(out, flags, prio); }

#define WITH_STREAM(name, h, ptsz, body)                                                           \
    do {                                                                                           \
        ENTER(name);                                                                               \
        pthread_mutex_lock(&sim_lock);                                                             \
        CUresult r = OK;                                                                           \
        struct stream *s = resolve((void *)(h), ptsz, &r);                                         \
        if (s) body;                                                                               \
        pthread_mutex_unlock(&sim_lock);                                                           \
        return r;                                                                                  \
    } while (0)

static CUresult get_priority(void *h, int *p, int ptsz) { WITH_STREAM("cuStreamGetPriority", h, ptsz, *p = s->priority); }
CUresult cuStreamGetPriority(void *h, int *p) { return get_priority(h, p, 0); }
CUresult cuStreamGetPriority_ptsz(void *h, int *p) { return get_priority(h, p, 1); }
static CUresult get_flags(void *h, unsigned *f, int ptsz) { WITH_STREAM("cuStreamGetFlags", h, ptsz, *f = s->flags); }
CUresult cuStreamGetFlags(void *h, unsigned *f) { return get_flags(h, f, 0); }
CUresult cuStreamGetFlags_ptsz(void *h, unsigned *f) { return get_flags(h, f, 1); }
static CUresult get_ctx(void *h, void **c, int ptsz) { WITH_STREAM("cuStreamGetCtx", h, ptsz, *c = s->ctx); }
CUresult cuStreamGetCtx(void *h, void **c) { return get_ctx(h, c, 0); }
CUresult cuStreamGetCtx_ptsz(void *h, void **c) { return get_ctx(h, c, 1); }

CUresult cuStreamDestroy_v2(void *h) {
    ENTER("cuStreamDestroy_v2");
    if ((uintptr_t)h <= 2) return E_INVALID_HANDLE;
    pthread_mutex_lock(&sim_lock);
    CUresult r = OK;
    struct stream *s = resolve(h, 0, &r);
    /* Work already on the stream still runs (CUDA releases the stream once it is done). */
    if (s) s->dead = 1, sim_log("stream-destroyed stream=%d", s->id);
    pthread_mutex_unlock(&sim_lock);
    return r;
}

/* Whether an operation that looks at or waits for s may be made now. */
static CUresult may_observe(struct stream *s, const char *call) {
    if (s->capturing) {
        s->invalidated = 1;
        sim_log("capture-error %s", call);
        return E_CAPTURE_UNSUPPORTED;
    }
    if (capture_forbids(call)) return E_CAPTURE_UNSUPPORTED;
    struct stream *t = implicit_capture(s);
    if (t) {
        t->invalidated = 1;
        sim_log("capture-error %s", call);
        return E_CAPTURE_IMPLICIT;
    }
    return OK;
}

static CUresult stream_sync(void *h, int ptsz) {
    WITH_STREAM("cuStreamSynchronize", h, ptsz, {
        r = may_observe(s, "cuStreamSynchronize");
        if (r == OK) wait_cmd(s->last);
    });
}
CUresult cuStreamSynchronize(void *h) { return stream_sync(h, 0); }
CUresult cuStreamSynchronize_ptsz(void *h) { return stream_sync(h, 1); }

static CUresult stream_query(void *h, int ptsz) {
    WITH_STREAM("cuStreamQuery", h, ptsz, {
        r = may_observe(s, "cuStreamQuery");
        if (r == OK && s->last && s->last->state != DONE) r = E_NOT_READY;
    });
}
CUresult cuStreamQuery(void *h) { return stream_query(h, 0); }
CUresult cuStreamQuery_ptsz(void *h) { return stream_query(h, 1); }

static CUresult is_capturing(void *h, int *st, int ptsz) {
    WITH_STREAM("cuStreamIsCapturing", h, ptsz, {
        if (implicit_capture(s))
            r = E_CAPTURE_IMPLICIT;
        else
            *st = s->capturing ? (s->invalidated ? 2 : 1) : 0;
    });
}
CUresult cuStreamIsCapturing(void *h, int *st) { return is_capturing(h, st, 0); }
CUresult cuStreamIsCapturing_ptsz(void *h, int *st) { return is_capturing(h, st, 1); }

CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
    int old = thread_mode;
    thread_mode = *mode;
    *mode = old;
    return OK;
}

/* Puts c on s unless s captures (then the operation is not supported by this simulation). */
static CUresult put(struct stream *s, struct cmd *c, const char *call) {
    if (s->capturing) {
        s->invalidated = 1;
        sim_log("capture-error %s (not simulated inside a capture)", call);
        return E_CAPTURE_UNSUPPORTED;
    }
    struct stream *t = implicit_capture(s);
    if (t) {
        t->invalidated = 1;
        sim_log("capture-error %s", call);
        return E_CAPTURE_IMPLICIT;
    }
    enqueue(s, c);
    return OK;
}

static CUresult host_func(void *h, void (*fn)(void *), void *data, int ptsz) {
    ENTER_WORK("cuLaunchHostFunc");
    WITH_STREAM("cuLaunchHostFunc", h, ptsz, {
        struct cmd *c = cmd_new(C_HOST);
        c->host = fn;
        c->host_data = data;
        r = put(s, c, "cuLaunchHostFunc");
    });
}
CUresult cuLaunchHostFunc(void *h, void (*fn)(void *), void *data) { return host_func(h, fn, data, 0); }
CUresult cuLaunchHostFunc_ptsz(void *h, void (*fn)(void *), void *data) { return host_func(h, fn, data, 1); }

/* ---- events ---- */

static struct event *event_of(void *h) {
    struct event *e = h;
    if (!e || e->magic != MAGIC_EVENT) return NULL;
    if (e->dead || e->ctx->dead) {
        sim_log("violation event %d used after it (or its context) was destroyed", e->id);
        return NULL;
    }
    return e;
}

CUresult cuEventCreate(void **out, unsigned flags) {
    (void)flags;
    ENTER("cuEventCreate");
    pthread_mutex_lock(&sim_lock);
    struct ctx *x = current_ctx();
    CUresult r = x && !x->dead ? OK : E_INVALID_CONTEXT;
    if (r == OK) {
        struct event *e = calloc(1, sizeof *e);
        e->magic = MAGIC_EVENT;
        e->id = ++nevents;
        e->ctx = x;
        *out = e;
    }
    pthread_mutex_unlock(&sim_lock);
    return r;
}
CUresult cuEventDestroy_v2(void *h) {
    ENTER("cuEventDestroy_v2");
    pthread_mutex_lock(&sim_lock);
    struct event *e = event_of(h);
    if (e) e->dead = 1;
    pthread_mutex_unlock(&sim_lock);
    return e ? OK : E_INVALID_HANDLE;
}
static CUresult record(void *ev, void *h, int ptsz) {
    /* A record after the exit handler loses nothing (the shim's completion watchers may still
     * record their own sync events then): plain ENTER. */
    WITH_STREAM("cuEventRecord", h, ptsz, {
        struct event *e = event_of(ev);
        if (!e || e->ctx != s->ctx) {
            r = E_INVALID_HANDLE;
        } else {
            struct cmd *c = cmd_new(C_RECORD);
            c->ev = e;
            c->ev_seq = e->recorded + 1;
            r = put(s, c, "cuEventRecord");
            if (r == OK) e->recorded++;
        }
    });
}
CUresult cuEventRecord(void *e, void *h) { return record(e, h, 0); }
CUresult cuEventRecord_ptsz(void *e, void *h) { return record(e, h, 1); }
CUresult cuEventRecordWithFlags(void *e, void *h, unsigned f) { (void)f; return record(e, h, 0); }
CUresult cuEventRecordWithFlags_ptsz(void *e, void *h, unsigned f) { (void)f; return record(e, h, 1); }

CUresult cuEventQuery(void *h) {
    ENTER("cuEventQuery");
    pthread_mutex_lock(&sim_lock);
    struct event *e = event_of(h);
    CUresult r = !e ? E_INVALID_HANDLE
                 : capture_forbids("cuEventQuery") ? E_CAPTURE_UNSUPPORTED
                 : e->completed >= e->recorded ? OK
                                               : E_NOT_READY;
    pthread_mutex_unlock(&sim_lock);
    return r;
}
CUresult cuEventSynchronize(void *h) {
    ENTER("cuEventSynchronize");
    pthread_mutex_lock(&sim_lock);
    struct event *e = event_of(h);
    CUresult r = !e ? E_INVALID_HANDLE : capture_forbids("cuEventSynchronize") ? E_CAPTURE_UNSUPPORTED : OK;
    if (r == OK) {
        long target = e->recorded;
        while (e->completed < target) pthread_cond_wait(&sim_done_cv, &sim_lock);
    }
    pthread_mutex_unlock(&sim_lock);
    return r;
}
static CUresult wait_event(void *h, void *ev, unsigned flags, int ptsz) {
    (void)flags;
    ENTER_WORK("cuStreamWaitEvent");
    WITH_STREAM("cuStreamWaitEvent", h, ptsz, {
        struct event *e = event_of(ev);
        if (!e) {
            r = E_INVALID_HANDLE;
        } else {
            /* Waits for the event's most recent record at the time of this call. */
            struct cmd *c = cmd_new(C_WAIT);
            c->ev = e;
            c->ev_seq = e->recorded;
            r = put(s, c, "cuStreamWaitEvent");
        }
    });
}
CUresult cuStreamWaitEvent(void *h, void *e, unsigned f) { return wait_event(h, e, f, 0); }
CUresult cuStreamWaitEvent_ptsz(void *h, void *e, unsigned f) { return wait_event(h, e, f, 1); }

/* ---- memory ---- */

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    ENTER("cuMemAlloc_v2");
    pthread_mutex_lock(&sim_lock);
    CUresult r = capture_forbids("cuMemAlloc") ? E_CAPTURE_UNSUPPORTED : OK;
    if (r == OK) *p = alloc_new(bytes), r = *p ? OK : 2;
    pthread_mutex_unlock(&sim_lock);
    return r;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
    ENTER_WORK("cuMemFree_v2");
    pthread_mutex_lock(&sim_lock);
    CUresult r = capture_forbids("cuMemFree") ? E_CAPTURE_UNSUPPORTED : OK;
    if (r == OK) {
        /* Freeing synchronizes with the device, as cudaFree does. */
        wait_all();
        r = alloc_free(p) == 0 ? OK : E_INVALID_VALUE;
        sim_log("free ptr=%llx", p);
    }
    pthread_mutex_unlock(&sim_lock);
    return r;
}

/* A copy or set on stream h (async), or on the calling thread's default stream and waited for
 * when `sync` (the synchronous calls). */
static CUresult mem_op(struct cmd *c, void *h, int ptsz, int sync, const char *call) {
    pthread_mutex_lock(&sim_lock);
    CUresult r = OK;
    struct stream *s = resolve(h, ptsz, &r);
    if (s && sync && capture_forbids(call)) r = E_CAPTURE_UNSUPPORTED, s = NULL;
    if (s) {
        uint64_t dev = c->kind == C_COPY && c->bytes && c->src && alloc_live((uint64_t)(uintptr_t)c->src)
                           ? (uint64_t)(uintptr_t)c->src
                           : (uint64_t)(uintptr_t)c->dst;
        if (!alloc_live(dev)) {
            sim_log("violation %s on device memory that is not allocated", call);
            r = E_INVALID_VALUE;
        } else {
            r = put(s, c, call);
            if (r == OK && sync && c->kind == C_COPY) wait_cmd(c);
        }
    }
    pthread_mutex_unlock(&sim_lock);
    return r;
}

static CUresult htod(CUdeviceptr dst, const void *src, size_t n, void *h, int ptsz, int sync) {
    ENTER_WORK("cuMemcpyHtoD");
    struct cmd *c = cmd_new(C_COPY);
    void *staged = malloc(n ? n : 1);
    memcpy(staged, src, n); /* pageable memory: the source is read at the call */
    c->dst = (void *)(uintptr_t)dst, c->src = staged, c->bytes = n;
    return mem_op(c, h, ptsz, sync, "cuMemcpyHtoD");
}
static CUresult dtoh(void *dst, CUdeviceptr src, size_t n, void *h, int ptsz, int sync) {
    ENTER_WORK("cuMemcpyDtoH");
    struct cmd *c = cmd_new(C_COPY);
    c->dst = dst, c->src = (const void *)(uintptr_t)src, c->bytes = n;
    return mem_op(c, h, ptsz, sync, "cuMemcpyDtoH");
}
static CUresult set32(CUdeviceptr dst, unsigned v, size_t count, void *h, int ptsz, int sync) {
    ENTER_WORK("cuMemsetD32");
    struct cmd *c = cmd_new(C_SET);
    c->dst = (void *)(uintptr_t)dst, c->value = v, c->bytes = count * 4;
    return mem_op(c, h, ptsz, sync, "cuMemsetD32");
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { return htod(d, s, n, 0, 0, 1); }
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void *s, size_t n) { return htod(d, s, n, 0, 1, 1); }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { return dtoh(d, s, n, 0, 0, 1); }
CUresult cuMemcpyDtoH_v2_ptds(void *d, CUdeviceptr s, size_t n) { return dtoh(d, s, n, 0, 1, 1); }
/* Synchronous memset of device memory is asynchronous to the host, on the default stream. */
CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned v, size_t n) { return set32(d, v, n, 0, 0, 1); }
CUresult cuMemsetD32_v2_ptds(CUdeviceptr d, unsigned v, size_t n) { return set32(d, v, n, 0, 1, 1); }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *h) { return htod(d, s, n, h, 0, 0); }
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void *s, size_t n, void *h) { return htod(d, s, n, h, 1, 0); }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *h) { return dtoh(d, s, n, h, 0, 0); }
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *d, CUdeviceptr s, size_t n, void *h) { return dtoh(d, s, n, h, 1, 0); }
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, void *h) { return set32(d, v, n, h, 0, 0); }
CUresult cuMemsetD32Async_ptsz(CUdeviceptr d, unsigned v, size_t n, void *h) { return set32(d, v, n, h, 1, 0); }
