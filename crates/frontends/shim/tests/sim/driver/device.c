/* The simulated device: the command FIFOs, the device thread that runs them, device memory, the
 * log, the driver's exit and fork handlers, and the sim_* calls a test application uses to look
 * at the device (what ran, in which order, whether a gate is open). */
#define _GNU_SOURCE
#include "sim.h"
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

pthread_mutex_t sim_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t sim_done_cv = PTHREAD_COND_INITIALIZER;
int sim_exited, sim_child;

static pthread_cond_t work_cv;
static int log_fd = -1;
static long main_tid;
static long tick;
static struct cmd **cmds;
static long ncmds, cmds_cap;
static long released[4096];
static int nreleased, gates_open, started;

struct alloc {
    uint64_t base;
    size_t size;
    int live;
};
static struct alloc allocs[1024];
static int nallocs;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

long sim_tid(void) { return syscall(SYS_gettid); }

void sim_log(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (n > (int)sizeof buf - 2) n = sizeof buf - 2;
    buf[n++] = '\n';
    if (log_fd >= 0) {
        ssize_t w = write(log_fd, buf, (size_t)n);
        (void)w;
    }
}

static void before_fork(void) { pthread_mutex_lock(&sim_lock); }
static void after_fork_parent(void) { pthread_mutex_unlock(&sim_lock); }
static void after_fork_child(void) {
    /* The device thread is the parent's: nothing in the child reaches the device. */
    sim_child = 1;
    pthread_mutex_unlock(&sim_lock);
}

__attribute__((constructor)) static void sim_init(void) {
    main_tid = sim_tid();
    const char *p = getenv("SIM_LOG");
    log_fd = open(p ? p : "/dev/null", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&work_cv, &a);
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

static int is_released(long id) {
    if (gates_open) return 1;
    for (int i = 0; i < nreleased; i++)
        if (released[i] == id) return 1;
    return 0;
}

static int deps_done(struct cmd *c) {
    for (int i = 0; i < c->ndeps; i++)
        if (c->deps[i]->state != DONE) return 0;
    return c->kind != C_WAIT || c->ev->completed >= c->ev_seq;
}

static void finish(struct cmd *c) {
    switch (c->kind) {
    case C_KERNEL:
        if (c->guard) break; /* its blocks had their effects */
        if (c->ptr) {
            if (alloc_live(c->ptr))
                *(uint64_t *)(uintptr_t)c->ptr = (uint64_t)c->id;
            else
                sim_log("violation kernel %ld wrote freed device memory", c->id);
        }
        break;
    case C_COPY:
        memcpy(c->dst, c->src, c->bytes);
        break;
    case C_SET:
        for (size_t i = 0; i < c->bytes / 4; i++) ((uint32_t *)c->dst)[i] = c->value;
        break;
    case C_RECORD:
        if (c->ev_seq > c->ev->completed) c->ev->completed = c->ev_seq;
        break;
    default:
        break;
    }
    c->state = DONE;
    c->end = ++tick;
    struct stream *s = c->s;
    s->head = c->next;
    if (!s->head) s->tail = NULL;
    if (c->guard)
        sim_log("done n=%ld stream=%d prio=%d kind=%c id=%ld start=%ld end=%ld graph=%ld guard=%d epoch=%u "
                "stopped=%d ran=%ld",
                c->n, s->id, s->priority, "KCSRWH"[c->kind], c->id, c->start, c->end, c->graph, c->gflag != 0,
                c->epoch, c->stopped, c->ran);
    else
        sim_log("done n=%ld stream=%d prio=%d kind=%c id=%ld start=%ld end=%ld graph=%ld", c->n, s->id,
                s->priority, "KCSRWH"[c->kind], c->id, c->start, c->end, c->graph);
}

/* A device word the kernel reads or writes (NULL, and logged, when the memory is not live). */
static uint32_t *word(struct cmd *c, uint64_t base, long i, const char *what) {
    uint64_t p = base + 4 * (uint64_t)i;
    if (alloc_live(p)) return (uint32_t *)(uintptr_t)p;
    sim_log("violation kernel %ld used freed device memory (%s)", c->id, what);
    return NULL;
}

/* Runs a guard-built kernel's blocks (lock held): 1 when the run has ended (all blocks, or
 * stopped by the flag), 0 while a block runs until *deadline. */
static int step_guarded(struct cmd *c, double now) {
    for (;;) {
        if (c->in_block) {
            if (c->deadline > now) return 0;
            c->in_block = 0;
            uint32_t *n = c->ptr ? word(c, c->ptr, c->block, "counter") : NULL;
            if (n) (*n)++;
            uint32_t *d = c->gdone ? word(c, c->gdone, c->block, "completion array") : NULL;
            if (d) *d = c->epoch;
            c->ran++;
            c->block++;
        }
        if (c->block >= c->blocks) return 1;
        uint32_t *flag = c->gflag ? word(c, c->gflag, 0, "flag") : NULL;
        if (flag && *flag) {
            c->stopped = 1;
            return 1;
        }
        uint32_t *d = c->gdone ? word(c, c->gdone, c->block, "completion array") : NULL;
        if (d && *d == c->epoch) {
            c->block++;
            continue;
        }
        c->in_block = 1;
        c->deadline = now + (double)c->dur_us;
    }
}

static void *device_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&sim_lock);
    for (;;) {
        double now = now_us(), next = now + 50000;
        int progressed = 0;
    again:
        for (struct stream *s = stream_list(); s; s = s->next_all) {
            struct cmd *c;
            while ((c = s->head)) {
                if (c->state == QUEUED) {
                    if (!deps_done(c)) break;
                    c->state = RUNNING;
                    c->start = ++tick;
                    c->deadline = now + (c->kind == C_KERNEL ? (double)c->dur_us : 0);
                    progressed = 1;
                }
                if (c->kind == C_KERNEL && c->guard) {
                    if (!step_guarded(c, now)) {
                        if (c->deadline < next) next = c->deadline;
                        break;
                    }
                    finish(c);
                    progressed = 1;
                    continue;
                }
                if (c->kind == C_KERNEL && (c->flags & F_GATE) && !is_released(c->id)) break;
                if (c->deadline > now) {
                    if (c->deadline < next) next = c->deadline;
                    break;
                }
                if (c->kind == C_HOST && c->host) {
                    /* The application's function runs without the device's lock, as a driver
                     * thread would run it. */
                    void (*f)(void *) = c->host;
                    c->host = NULL;
                    pthread_mutex_unlock(&sim_lock);
                    f(c->host_data);
                    pthread_mutex_lock(&sim_lock);
                    finish(c);
                    progressed = 1;
                    goto again;
                }
                finish(c);
                progressed = 1;
            }
        }
        if (progressed) {
            pthread_cond_broadcast(&sim_done_cv);
            continue;
        }
        struct timespec ts;
        ts.tv_sec = (time_t)(next / 1e6);
        ts.tv_nsec = (long)((next - (double)ts.tv_sec * 1e6) * 1e3);
        if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
        pthread_cond_timedwait(&work_cv, &sim_lock, &ts);
    }
    return NULL;
}

static void sim_exit(void) {
    if (sim_child) return;
    pthread_mutex_lock(&sim_lock);
    /* A real driver's exit handler lets submitted work finish; a gate still closed here is the
     * test application's mistake, not a reason to hang. */
    gates_open = 1;
    pthread_cond_signal(&work_cv);
    wait_all();
    sim_log("exit cmds=%ld", ncmds);
    sim_exited = 1;
    pthread_mutex_unlock(&sim_lock);
}

void sim_start(void) {
    pthread_mutex_lock(&sim_lock);
    if (!started) {
        started = 1;
        pthread_t t;
        pthread_create(&t, NULL, device_main, NULL);
        pthread_detach(t);
        /* Like libcuda, the exit handler is registered at cuInit. */
        atexit(sim_exit);
    }
    pthread_mutex_unlock(&sim_lock);
}

struct cmd *cmd_new(enum cmd_kind kind) {
    struct cmd *c = calloc(1, sizeof *c);
    c->kind = kind;
    return c;
}

static int blocking(struct stream *t) {
    return t->kind == S_PER_THREAD || (t->kind == S_CREATED && !(t->flags & STREAM_NON_BLOCKING));
}

static void add_dep(struct cmd *c, struct cmd *d) {
    if (!d || d->state == DONE) return;
    c->deps = realloc(c->deps, sizeof *c->deps * (size_t)(c->ndeps + 1));
    c->deps[c->ndeps++] = d;
}

void enqueue(struct stream *s, struct cmd *c) {
    c->s = s;
    if (ncmds + 2 > cmds_cap) {
        cmds_cap = cmds_cap ? 2 * cmds_cap : 1024;
        cmds = realloc(cmds, sizeof *cmds * (size_t)cmds_cap);
    }
    c->n = ++ncmds;
    cmds[c->n] = c;
    /* The legacy default stream waits for every blocking stream of its context, and they wait
     * for it; non-blocking streams are exempt. */
    if (s->kind == S_LEGACY) {
        for (struct stream *t = stream_list(); t; t = t->next_all)
            if (t != s && t->ctx == s->ctx && blocking(t)) add_dep(c, t->last);
    } else if (blocking(s) && s->ctx->legacy) {
        add_dep(c, s->ctx->legacy->last);
    }
    if (s->tail)
        s->tail->next = c;
    else
        s->head = c;
    s->tail = c;
    s->last = c;
    sim_log("submit n=%ld pid=%d thread=%s stream=%d kind=%c id=%ld", c->n, (int)getpid(),
            sim_tid() == main_tid ? "main" : "other", s->id, "KCSRWH"[c->kind], c->id);
    pthread_cond_signal(&work_cv);
}

void wait_cmd(struct cmd *c) {
    while (c && c->state != DONE) pthread_cond_wait(&sim_done_cv, &sim_lock);
}

static int busy(struct ctx *x) {
    for (struct stream *s = stream_list(); s; s = s->next_all)
        if (s->head && (!x || s->ctx == x)) return 1;
    return 0;
}

void wait_ctx(struct ctx *x) {
    while (busy(x)) pthread_cond_wait(&sim_done_cv, &sim_lock);
}

void wait_all(void) { wait_ctx(NULL); }

int kernel_pending_in(struct module *m) {
    for (struct stream *s = stream_list(); s; s = s->next_all)
        for (struct cmd *c = s->head; c; c = c->next)
            if (c->kind == C_KERNEL && c->fn && c->fn->mod == m) return 1;
    return 0;
}

int alloc_live(uint64_t p) {
    for (int i = 0; i < nallocs; i++)
        if (allocs[i].live && p >= allocs[i].base && p < allocs[i].base + allocs[i].size) return 1;
    return 0;
}

uint64_t alloc_new(size_t bytes) {
    if (nallocs == 1024) return 0;
    /* Never given back to malloc: a late access must not touch live memory of someone else. */
    void *p = calloc(1, bytes + 16);
    allocs[nallocs++] = (struct alloc){(uint64_t)(uintptr_t)p, bytes, 1};
    return (uint64_t)(uintptr_t)p;
}

int alloc_free(uint64_t p) {
    for (int i = 0; i < nallocs; i++)
        if (allocs[i].live && allocs[i].base == p) {
            allocs[i].live = 0;
            return 0;
        }
    return -1;
}

/* ---- what a test application may ask the device ---- */

static struct cmd *find_kernel(long id) {
    for (long i = ncmds; i > 0; i--)
        if (cmds[i]->kind == C_KERNEL && cmds[i]->id == id) return cmds[i];
    return NULL;
}

/* -1: never reached the driver; else QUEUED, RUNNING or DONE (the latest launch of that id). */
int sim_state(long id) {
    pthread_mutex_lock(&sim_lock);
    struct cmd *c = find_kernel(id);
    int r = c ? (int)c->state : -1;
    pthread_mutex_unlock(&sim_lock);
    return r;
}

/* Whether kernel a finished before kernel b started (both done). */
int sim_before(long a, long b) {
    pthread_mutex_lock(&sim_lock);
    struct cmd *x = find_kernel(a), *y = find_kernel(b);
    int r = x && y && x->state == DONE && y->state == DONE && x->end < y->start;
    pthread_mutex_unlock(&sim_lock);
    return r;
}

/* How many launches of kernel id have run to the end. */
long sim_runs(long id) {
    long r = 0;
    pthread_mutex_lock(&sim_lock);
    for (long i = 1; i <= ncmds; i++)
        if (cmds[i]->kind == C_KERNEL && cmds[i]->id == id && cmds[i]->state == DONE) r++;
    pthread_mutex_unlock(&sim_lock);
    return r;
}

/* How many runs of kernel id were stopped by the guard flag. */
long sim_stops(long id) {
    long r = 0;
    pthread_mutex_lock(&sim_lock);
    for (long i = 1; i <= ncmds; i++)
        if (cmds[i]->kind == C_KERNEL && cmds[i]->id == id && cmds[i]->state == DONE && cmds[i]->stopped) r++;
    pthread_mutex_unlock(&sim_lock);
    return r;
}

/* Opens the gate of kernel id (before or after it was launched). */
void sim_release(long id) {
    pthread_mutex_lock(&sim_lock);
    if (nreleased < 4096) released[nreleased++] = id;
    pthread_cond_signal(&work_cv);
    pthread_mutex_unlock(&sim_lock);
}
