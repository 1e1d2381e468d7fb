/* The simulated driver's modules and libraries, kernel launches, stream capture and graphs, and
 * cuGetProcAddress (how the CUDA runtime finds every entry point, per-thread variants included).
 *
 * Every simulated kernel takes four 8-byte arguments: (id, microseconds it runs, flags, device
 * pointer it writes its id to at the end, or 0); a guard-built one takes the guard's three first
 * (sim.h). Function handles of an unloaded module are handed out again, as a driver may. */
#define _GNU_SOURCE
#include "sim.h"
#include <stdlib.h>
#include <stdio.h>
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
static struct func *funcs[1024];
static int nfuncs;

static CUresult get_function(void **out, void *m, const char *name) {
    if (!m || ((struct module *)m)->dead) return E_INVALID_HANDLE;
    pthread_mutex_lock(&sim_lock);
    struct func *f = NULL;
    for (int i = 0; i < nfuncs && !f; i++)
        if (funcs[i]->mod->dead) f = funcs[i];
    if (!f) {
        f = calloc(1, sizeof *f);
        if (nfuncs < 1024) funcs[nfuncs++] = f;
    }
    f->magic = MAGIC_FUNC;
    f->mod = m;
    snprintf(f->name, sizeof f->name, "%s", name ? name : "");
    f->guard = !strncmp(f->name, "guarded", 7) || !strncmp(f->name, "unmarked", 8);
    *out = f;
    pthread_mutex_unlock(&sim_lock);
    return OK;
}

static CUresult get_global(uint64_t *p, size_t *bytes, void *h, const char *name) {
    struct module *m = h;
    if (!m || m->dead) return E_INVALID_HANDLE;
    const char *prefix = "xpreempt_guard_";
    if (!name || strncmp(name, prefix, strlen(prefix)) || strncmp(name + strlen(prefix), "guarded", 7))
        return E_NOT_FOUND;
    pthread_mutex_lock(&sim_lock);
    if (!m->marker) m->marker = alloc_new(4);
    if (p) *p = m->marker;
    if (bytes) *bytes = 4;
    pthread_mutex_unlock(&sim_lock);
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
CUresult cuModuleGetFunction(void **f, void *m, const char *name) { ENTER("cuModuleGetFunction"); return get_function(f, m, name); }
CUresult cuModuleUnload(void *m) { ENTER_WORK("cuModuleUnload"); return unload(m, "cuModuleUnload"); }
CUresult cuLibraryLoadData(void **lib, const void *code, void *jo, void **jv, unsigned nj, void *lo, void **lv, unsigned nl) {
    (void)code, (void)jo, (void)jv, (void)nj, (void)lo, (void)lv, (void)nl;
    ENTER("cuLibraryLoadData");
    return load(lib);
}
CUresult cuLibraryGetKernel(void **k, void *lib, const char *name) { ENTER("cuLibraryGetKernel"); return get_function(k, lib, name); }
CUresult cuModuleGetGlobal_v2(uint64_t *p, size_t *bytes, void *m, const char *name) { ENTER("cuModuleGetGlobal"); return get_global(p, bytes, m, name); }
CUresult cuLibraryGetGlobal(uint64_t *p, size_t *bytes, void *lib, const char *name) { ENTER("cuLibraryGetGlobal"); return get_global(p, bytes, lib, name); }

/* Modules and libraries are one kind here: a CUfunction and a CUkernel answer both queries. */
static CUresult get_name(const char **name, void *h) {
    struct func *f = h;
    if (!f || f->magic != MAGIC_FUNC || f->mod->dead) return E_INVALID_HANDLE;
    *name = f->name;
    return OK;
}
static CUresult get_owner(void **owner, void *h) {
    struct func *f = h;
    if (!f || f->magic != MAGIC_FUNC || f->mod->dead) return E_INVALID_HANDLE;
    *owner = f->mod;
    return OK;
}
CUresult cuFuncGetName(const char **name, void *f) { ENTER("cuFuncGetName"); return get_name(name, f); }
CUresult cuKernelGetName(const char **name, void *k) { ENTER("cuKernelGetName"); return get_name(name, k); }
CUresult cuFuncGetModule(void **m, void *f) { ENTER("cuFuncGetModule"); return get_owner(m, f); }
CUresult cuKernelGetLibrary(void **lib, void *k) { ENTER("cuKernelGetLibrary"); return get_owner(lib, k); }
CUresult cuLibraryUnload(void *lib) { ENTER_WORK("cuLibraryUnload"); return unload(lib, "cuLibraryUnload"); }

static CUresult param_info(void *h, size_t i, size_t *off, size_t *size) {
    struct func *f = h;
    if (!f || f->magic != MAGIC_FUNC || f->mod->dead) return E_INVALID_HANDLE;
    if (i >= (size_t)(f->guard ? 7 : 4)) return E_INVALID_VALUE;
    *off = 8 * i;
    *size = f->guard && i == 2 ? 4 : 8;
    return OK;
}
CUresult cuFuncGetParamInfo(void *f, size_t i, size_t *off, size_t *size) { ENTER("cuFuncGetParamInfo"); return param_info(f, i, off, size); }
CUresult cuKernelGetParamInfo(void *f, size_t i, size_t *off, size_t *size) { ENTER("cuKernelGetParamInfo"); return param_info(f, i, off, size); }

/* ---- launches ---- */

struct args {
    long id, dur_us;
    unsigned long flags;
    uint64_t ptr;
    uint64_t gflag, gdone;
    unsigned epoch;
};

static int read_args(struct func *f, void **params, void **extra, struct args *a) {
    int g = f->guard ? 3 : 0;
    if (params) {
        if (g) {
            a->gflag = *(uint64_t *)params[0];
            a->gdone = *(uint64_t *)params[1];
            a->epoch = *(unsigned *)params[2];
        }
        a->id = *(long *)params[g];
        a->dur_us = *(long *)params[g + 1];
        a->flags = *(unsigned long *)params[g + 2];
        a->ptr = *(uint64_t *)params[g + 3];
        return 1;
    }
    const long *buf = NULL;
    size_t size = 0;
    for (int i = 0; extra && extra[i] && i < 16; i += 2) {
        if ((uintptr_t)extra[i] == 1) buf = extra[i + 1];
        if ((uintptr_t)extra[i] == 2) size = *(size_t *)extra[i + 1];
    }
    if (!buf || size < (size_t)(32 + 8 * g)) return 0;
    if (g) a->gflag = (uint64_t)buf[0], a->gdone = (uint64_t)buf[1], a->epoch = *(const unsigned *)&buf[2];
    buf += g;
    a->id = buf[0], a->dur_us = buf[1], a->flags = (unsigned long)buf[2], a->ptr = (uint64_t)buf[3];
    return 1;
}

static struct cmd *kernel_cmd(struct func *f, const struct args *a, long blocks) {
    struct cmd *c = cmd_new(C_KERNEL);
    c->fn = f, c->id = a->id, c->dur_us = a->dur_us, c->flags = (unsigned)a->flags, c->ptr = a->ptr;
    c->guard = f->guard, c->gflag = a->gflag, c->gdone = a->gdone, c->epoch = a->epoch;
    c->blocks = blocks;
    return c;
}

static CUresult launch(void *fh, void *h, void **params, void **extra, int ptsz, long blocks) {
    ENTER_WORK("cuLaunchKernel");
    struct func *f = fh;
    struct args a = {0};
    if (!f || f->magic != MAGIC_FUNC) return E_INVALID_HANDLE;
    if (!read_args(f, params, extra, &a)) return E_INVALID_VALUE;
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
    } else if ((long)a.gflag == POISON || (long)a.gdone == POISON) {
        sim_log("violation a guarded kernel was launched with arguments overwritten after the launch call");
        r = E_INVALID_VALUE;
    } else if ((a.ptr && !alloc_live(a.ptr)) || (a.gflag && !alloc_live(a.gflag)) ||
               (a.gdone && !alloc_live(a.gdone + 4 * (uint64_t)(blocks - 1)))) {
        sim_log("violation kernel %ld launched with freed or foreign device memory", a.id);
        r = E_INVALID_VALUE;
    } else if ((a.gflag || a.gdone) && !a.epoch) {
        sim_log("violation kernel %ld launched with guard values and epoch 0", a.id);
        r = E_INVALID_VALUE;
    } else if (s->capturing) {
        struct graph *g = s->graph;
        if (g->n < 256) g->nodes[g->n++] = kernel_cmd(f, &a, blocks);
        sim_log("captured stream=%d id=%ld", s->id, a.id);
    } else {
        struct stream *t = implicit_capture(s);
        if (t) {
            t->invalidated = 1;
            sim_log("capture-error cuLaunchKernel");
            r = E_CAPTURE_IMPLICIT;
        } else {
            enqueue(s, kernel_cmd(f, &a, blocks));
        }
    }
out:
    pthread_mutex_unlock(&sim_lock);
    return r;
}

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, void *s, void **params, void **extra) {
    (void)bx, (void)by, (void)bz, (void)smem;
    return launch(f, s, params, extra, 0, (long)gx * gy * gz);
}
CUresult cuLaunchKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                             unsigned smem, void *s, void **params, void **extra) {
    (void)bx, (void)by, (void)bz, (void)smem;
    return launch(f, s, params, extra, 1, (long)gx * gy * gz);
}
CUresult cuLaunchCooperativeKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                   unsigned bz, unsigned smem, void *s, void **params) {
    (void)bx, (void)by, (void)bz, (void)smem;
    return launch(f, s, params, NULL, 0, (long)gx * gy * gz);
}
CUresult cuLaunchCooperativeKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                        unsigned bz, unsigned smem, void *s, void **params) {
    (void)bx, (void)by, (void)bz, (void)smem;
    return launch(f, s, params, NULL, 1, (long)gx * gy * gz);
}
/* CUlaunchConfig: grid and block (6 x 4 bytes), shared memory (4), stream at byte 32. */
static long config_blocks(const void *config) {
    const unsigned *d = config;
    return (long)d[0] * d[1] * d[2];
}
CUresult cuLaunchKernelEx(const void *config, void *f, void **params, void **extra) {
    return launch(f, *(void *const *)((const char *)config + 32), params, extra, 0, config_blocks(config));
}
CUresult cuLaunchKernelEx_ptsz(const void *config, void *f, void **params, void **extra) {
    return launch(f, *(void *const *)((const char *)config + 32), params, extra, 1, config_blocks(config));
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
            c->guard = node->guard, c->gflag = node->gflag, c->gdone = node->gdone, c->epoch = node->epoch;
            c->blocks = node->blocks;
            enqueue(s, c);
        }
    }
    pthread_mutex_unlock(&sim_lock);
    return r;
}
CUresult cuGraphLaunch(void *e, void *s) { return graph_launch(e, s, 0); }
CUresult cuGraphLaunch_ptsz(void *e, void *s) { return graph_launch(e, s, 1); }
