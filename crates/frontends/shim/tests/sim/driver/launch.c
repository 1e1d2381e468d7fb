/* The simulated driver's modules and libraries, kernel launches, stream capture and graphs, and
 * cuGetProcAddress (how the CUDA runtime finds every entry point, per-thread variants included).
 *
 * Every simulated kernel takes four 8-byte arguments: (id, microseconds it runs, flags, device
 * pointer it writes its id to at the end, or 0). */
#define _GNU_SOURCE
#include "sim.h"
#include <stdlib.h>
#include <string.h>

static int nmodules;
static long graph_launches;

struct exec {
    struct graph *g;
};

/* ---- modules and libraries ---- */

static CUresult load(void **out) {
    pthread_mutex_lock(&sim_lock);
    struct module *m = calloc(1, sizeof *m);
    m->id = ++nmodules;
    *out = m;
    pthread_mutex_unlock(&sim_lock);
    return OK;
}
static CUresult get_function(void **out, void *m) {
    if (!m || ((struct module *)m)->dead) return E_INVALID_HANDLE;
    struct func *f = calloc(1, sizeof *f);
    f->magic = MAGIC_FUNC;
    f->mod = m;
    *out = f;
    return OK;
}
static CUresult unload(void *h, const char *call) {
    struct module *m = h;
    pthread_mutex_lock(&sim_lock);
    CUresult r = m && !m->dead ? OK : E_INVALID_HANDLE;
    if (r == OK) {
        /* The module's code stays until its submitted kernels have run. */
        while (kernel_pending_in(m)) pthread_cond_wait(&sim_done_cv, &sim_lock);
        m->dead = 1;
        sim_log("unload %s module=%d", call, m->id);
    }
    pthread_mutex_unlock(&sim_lock);
    return r;
}

CUresult cuModuleLoadData(void **m, const void *image) { (void)image; ENTER("cuModuleLoadData"); return load(m); }
CUresult cuModuleGetFunction(void **f, void *m, const char *name) { (void)name; ENTER("cuModuleGetFunction"); return get_function(f, m); }
CUresult cuModuleUnload(void *m) { ENTER_WORK("cuModuleUnload"); return unload(m, "cuModuleUnload"); }
CUresult cuLibraryLoadData(void **lib, const void *code, void *jo, void **jv, unsigned nj, void *lo, void **lv, unsigned nl) {
    (void)code, (void)jo, (void)jv, (void)nj, (void)lo, (void)lv, (void)nl;
    ENTER("cuLibraryLoadData");
    return load(lib);
}
CUresult cuLibraryGetKernel(void **k, void *lib, const char *name) { (void)name; ENTER("cuLibraryGetKernel"); return get_function(k, lib); }
CUresult cuLibraryUnload(void *lib) { ENTER_WORK("cuLibraryUnload"); return unload(lib, "cuLibraryUnload"); }

static CUresult param_info(void *h, size_t i, size_t *off, size_t *size) {
    struct func *f = h;
    if (!f || f->magic != MAGIC_FUNC || f->mod->dead) return E_INVALID_HANDLE;
    if (i >= 4) return E_INVALID_VALUE;
    *off = 8 * i;
    *size = 8;
    return OK;
}
CUresult cuFuncGetParamInfo(void *f, size_t i, size_t *off, size_t *size) { ENTER("cuFuncGetParamInfo"); return param_info(f, i, off, size); }
CUresult cuKernelGetParamInfo(void *f, size_t i, size_t *off, size_t *size) { ENTER("cuKernelGetParamInfo"); return param_info(f, i, off, size); }

/* ---- launches ---- */

struct args {
    long id, dur_us;
    unsigned long flags;
    uint64_t ptr;
};

static int read_args(void **params, void **extra, struct args *a) {
    if (params) {
        a->id = *(long *)params[0];
        a->dur_us = *(long *)params[1];
        a->flags = *(unsigned long *)params[2];
        a->ptr = *(uint64_t *)params[3];
        return 1;
    }
    const long *buf = NULL;
    size_t size = 0;
    for (int i = 0; extra && extra[i] && i < 16; i += 2) {
        if ((uintptr_t)extra[i] == 1) buf = extra[i + 1];
        if ((uintptr_t)extra[i] == 2) size = *(size_t *)extra[i + 1];
    }
    if (!buf || size < 32) return 0;
    a->id = buf[0], a->dur_us = buf[1], a->flags = (unsigned long)buf[2], a->ptr = (uint64_t)buf[3];
    return 1;
}

static struct cmd *kernel_cmd(struct func *f, const struct args *a) {
    struct cmd *c = cmd_new(C_KERNEL);
    c->fn = f, c->id = a->id, c->dur_us = a->dur_us, c->flags = (unsigned)a->flags, c->ptr = a->ptr;
    return c;
}

static CUresult launch(void *fh, void *h, void **params, void **extra, int ptsz) {
    ENTER_WORK("cuLaunchKernel");
    struct func *f = fh;
    struct args a;
    if (!f || f->magic != MAGIC_FUNC) return E_INVALID_HANDLE;
    if (!read_args(params, extra, &a)) return E_INVALID_VALUE;
    pthread_mutex_lock(&sim_lock);
    CUresult r = OK;
    struct stream *s = resolve(h, ptsz, &r);
    if (!s) goto out;
    if (f->mod->dead) {
        sim_log("violation kernel %ld launched after its module was unloaded", a.id);
        r = E_INVALID_HANDLE;
    } else if (a.id == POISON || a.dur_us == POISON || (long)a.flags == POISON || (long)a.ptr == POISON) {
        sim_log("violation a kernel was launched with arguments overwritten after the launch call");
        r = E_INVALID_VALUE;
    } else if (a.flags & F_REFUSE) {
        sim_log("refused id=%ld", a.id);
        r = E_LAUNCH_OUT_OF_RESOURCES;
    } else if (a.ptr && !alloc_live(a.ptr)) {
        sim_log("violation kernel %ld launched with freed device memory", a.id);
        r = E_INVALID_VALUE;
    } else if (s->capturing) {
        struct graph *g = s->graph;
        if (g->n < 256) g->nodes[g->n++] = kernel_cmd(f, &a);
        sim_log("captured stream=%d id=%ld", s->id, a.id);
    } else {
        struct stream *t = implicit_capture(s);
        if (t) {
            t->invalidated = 1;
            sim_log("capture-error cuLaunchKernel");
            r = E_CAPTURE_IMPLICIT;
        } else {
            enqueue(s, kernel_cmd(f, &a));
        }
    }
out:
    pthread_mutex_unlock(&sim_lock);
    return r;
}

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, void *s, void **params, void **extra) {
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem;
    return launch(f, s, params, extra, 0);
}
CUresult cuLaunchKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                             unsigned smem, void *s, void **params, void **extra) {
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem;
    return launch(f, s, params, extra, 1);
}
CUresult cuLaunchCooperativeKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                   unsigned bz, unsigned smem, void *s, void **params) {
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem;
    return launch(f, s, params, NULL, 0);
}
CUresult cuLaunchCooperativeKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                        unsigned bz, unsigned smem, void *s, void **params) {
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem;
    return launch(f, s, params, NULL, 1);
}
/* CUlaunchConfig: grid and block (6 x 4 bytes), shared memory (4), stream at byte 32. */
CUresult cuLaunchKernelEx(const void *config, void *f, void **params, void **extra) {
    return launch(f, *(void *const *)((const char *)config + 32), params, extra, 0);
}
CUresult cuLaunchKernelEx_ptsz(const void *config, void *f, void **params, void **extra) {
    return launch(f, *(void *const *)((const char *)config + 32), params, extra, 1);
}

/* ---- stream capture and graphs ---- */

static CUresult begin_capture(void *h, int mode, int ptsz) {
    ENTER("cuStreamBeginCapture");
    pthread_mutex_lock(&sim_lock);
    CUresult r = OK;
    struct stream *s = resolve(h, ptsz, &r);
    if (s && (s->kind == S_LEGACY || s->capturing)) r = E_CAPTURE_UNSUPPORTED;
    if (s && r == OK) {
        s->capturing = 1, s->mode = mode, s->invalidated = 0, s->capture_tid = sim_tid();
        s->graph = calloc(1, sizeof *s->graph);
        sim_log("capture-begin stream=%d mode=%d", s->id, mode);
    }
    pthread_mutex_unlock(&sim_lock);
    return r;
}
CUresult cuStreamBeginCapture_v2(void *h, int mode) { return begin_capture(h, mode, 0); }
CUresult cuStreamBeginCapture_v2_ptsz(void *h, int mode) { return begin_capture(h, mode, 1); }

static CUresult end_capture(void *h, void **graph, int ptsz) {
    ENTER("cuStreamEndCapture");
    pthread_mutex_lock(&sim_lock);
    CUresult r = OK;
    struct stream *s = resolve(h, ptsz, &r);
    if (s && !s->capturing) r = E_INVALID_VALUE;
    if (s && r == OK) {
        s->capturing = 0;
        *graph = s->invalidated ? NULL : s->graph;
        r = s->invalidated ? E_CAPTURE_INVALIDATED : OK;
        sim_log("capture-end stream=%d result=%d", s->id, r);
    }
    pthread_mutex_unlock(&sim_lock);
    return r;
}
CUresult cuStreamEndCapture(void *h, void **g) { return end_capture(h, g, 0); }
CUresult cuStreamEndCapture_ptsz(void *h, void **g) { return end_capture(h, g, 1); }

CUresult cuGraphInstantiateWithFlags(void **out, void *g, unsigned long long flags) {
    (void)flags;
    ENTER("cuGraphInstantiateWithFlags");
    if (!g) return E_INVALID_VALUE;
    struct exec *e = calloc(1, sizeof *e);
    e->g = g;
    *out = e;
    return OK;
}
CUresult cuGraphExecDestroy(void *e) { (void)e; return OK; }
CUresult cuGraphDestroy(void *g) { (void)g; return OK; }

static CUresult graph_launch(void *eh, void *h, int ptsz) {
    ENTER_WORK("cuGraphLaunch");
    struct exec *e = eh;
    pthread_mutex_lock(&sim_lock);
    CUresult r = OK;
    struct stream *s = resolve(h, ptsz, &r);
    if (s && (s->capturing || implicit_capture(s))) r = E_CAPTURE_UNSUPPORTED;
    if (s && r == OK) {
        long number = ++graph_launches;
        for (int i = 0; i < e->g->n; i++) {
            struct cmd *c = cmd_new(C_KERNEL), *node = e->g->nodes[i];
            c->fn = node->fn, c->id = node->id, c->dur_us = node->dur_us, c->flags = node->flags;
            c->ptr = node->ptr, c->graph = number;
            enqueue(s, c);
        }
    }
    pthread_mutex_unlock(&sim_lock);
    return r;
}
CUresult cuGraphLaunch(void *e, void *s) { return graph_launch(e, s, 0); }
CUresult cuGraphLaunch_ptsz(void *e, void *s) { return graph_launch(e, s, 1); }
