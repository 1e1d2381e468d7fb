/* A simulated CUDA device behind a stand-in libcuda.so.1, for testing the shim without a GPU.
 *
 * Every stream is a FIFO run by one device thread; commands start when the command before them
 * on their stream and the commands CUDA orders them after (the legacy default stream's implicit
 * synchronization with blocking streams, event waits) have finished. Kernels run for the number
 * of microseconds their second argument says (or until the application opens their gate), write
 * their id to device memory when asked, and every command's start and end are logged with a
 * global tick, so a test can check what ran before what. Queries and synchronizations answer
 * from the simulated device's real state. Uses that a real driver would refuse or that would lose
 * work (a destroyed stream, freed memory, an unloaded module, a call after the driver's exit
 * handler, arguments overwritten before the launch) are logged as "violation" lines.
 *
 * The log ($SIM_LOG, appended with one write(2) per line) has:
 *   submit n=N pid=P thread=main|other stream=S kind=K id=I   (the command reached the device)
 *   done n=N stream=S kind=K id=I start=T end=T graph=G      (it ran; T: the device's ticks)
 *   violation TEXT                 (something a real driver would refuse, or lost work)
 *   refused id=I                   (a launch refused on purpose, flag F_REFUSE)
 *   capture-begin/-end, captured, capture-error CALL   (stream capture)
 *   free, unload, ctx-destroyed, stream-destroyed       (the synchronous calls)
 *   child CALL, late CALL, exit cmds=N   (calls in a forked child, after exit; the exit handler)
 * Kinds: K kernel, C copy, S memset, R event record, W event wait, H host function.
 *
 * Guard-built kernels (xpreempt_guard.cuh, Lv2): a function whose name starts with "guarded" or
 * "unmarked" takes the guard's three parameters first (flag pointer, completion-array pointer,
 * epoch: offsets 0, 8, 16) and then the usual four; a module has the marker global
 * xpreempt_guard_<name> only for the "guarded" ones. Such a kernel runs its blocks one after the
 * other, each for the kernel's microseconds: a block that begins while the flag word is nonzero
 * ends the run ("stopped"); a block whose completion word equals the epoch is skipped; a block
 * that runs adds one to its counter (a u32 per block at the kernel's pointer) and writes the
 * epoch to its completion word. A null flag never stops, a null array records nothing. Their done
 * lines add guard=0|1 (guard values given) epoch=E stopped=0|1 ran=R (blocks run). */
#ifndef SIM_H
#define SIM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum {
    OK = 0,
    E_INVALID_VALUE = 1,
    E_NOT_INITIALIZED = 3,
    E_DEINITIALIZED = 4,
    E_INVALID_CONTEXT = 201,
    E_INVALID_HANDLE = 400,
    E_NOT_FOUND = 500,
    E_NOT_READY = 600,
    E_LAUNCH_OUT_OF_RESOURCES = 701,
    E_CAPTURE_UNSUPPORTED = 900,
    E_CAPTURE_INVALIDATED = 901,
    E_CAPTURE_IMPLICIT = 906,
};

/* Kernel flags (the kernel's third argument). */
#define F_GATE 1u   /* runs until sim_release(id) */
#define F_REFUSE 2u /* the launch is refused with E_LAUNCH_OUT_OF_RESOURCES */
/* What the application writes over its argument copies right after a launch returns. */
#define POISON 0x5a5a5a5a5a5a5a5aLL

#define STREAM_NON_BLOCKING 1u
#define MODE_GLOBAL 0
#define MODE_THREAD_LOCAL 1
#define MODE_RELAXED 2

enum cmd_kind { C_KERNEL, C_COPY, C_SET, C_RECORD, C_WAIT, C_HOST };
enum stream_kind { S_CREATED, S_LEGACY, S_PER_THREAD };
enum cmd_state { QUEUED, RUNNING, DONE };

struct ctx {
    int id, dead, primary;
    struct stream *legacy;
};

struct module {
    int id, dead;
    uint64_t marker; /* the marker global (one per module, any "guarded" name) */
};

struct func {
    uint32_t magic;
    struct module *mod;
    char name[64];
    int guard; /* takes the guard's parameters */
};

struct event {
    uint32_t magic;
    int id, dead;
    struct ctx *ctx;
    long recorded, completed;
};

struct cmd {
    long n, id, dur_us, graph;
    enum cmd_kind kind;
    enum cmd_state state;
    struct stream *s;
    unsigned flags;
    uint64_t ptr;
    struct func *fn;
    void *dst;
    const void *src;
    size_t bytes;
    uint32_t value;
    struct event *ev;
    long ev_seq;
    void (*host)(void *);
    void *host_data;
    struct cmd **deps;
    int ndeps;
    long start, end;
    double deadline;
    /* A guard-built kernel: its guard values, blocks, progress. */
    int guard, stopped, in_block;
    uint64_t gflag, gdone;
    unsigned epoch;
    long blocks, block, ran;
    struct cmd *next;
};

struct graph {
    struct cmd *nodes[256];
    int n;
};

struct stream {
    uint32_t magic;
    int id, kind, dead, priority;
    unsigned flags;
    struct ctx *ctx;
    struct cmd *head, *tail, *last;
    int capturing, mode, invalidated;
    long capture_tid;
    struct graph *graph;
    struct stream *next_all;
};

#define MAGIC_STREAM 0x57524d31u
#define MAGIC_EVENT 0x45564e31u
#define MAGIC_FUNC 0x46554e31u

/* device.c: the device, its lock and log */
extern pthread_mutex_t sim_lock;
extern pthread_cond_t sim_done_cv;
extern int sim_exited, sim_child;
void sim_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void sim_start(void);
long sim_tid(void);
struct cmd *cmd_new(enum cmd_kind kind);
/* Appends to the stream's FIFO with the dependencies CUDA gives it (lock held). */
void enqueue(struct stream *s, struct cmd *c);
/* Waits (lock held) until command c, or every command numbered <= upto in ctx, is done. */
void wait_cmd(struct cmd *c);
void wait_ctx(struct ctx *x);
void wait_all(void);
int alloc_live(uint64_t p);
uint64_t alloc_new(size_t bytes);
int alloc_free(uint64_t p);
int kernel_pending_in(struct module *m);

/* api.c: contexts, streams, events */
struct ctx *current_ctx(void);
/* Resolves a stream handle as the application passed it; NULL with *err set when invalid. */
struct stream *resolve(void *h, int ptsz, CUresult *err);
struct stream *stream_list(void);
/* Nonzero (and the capture invalidated) when a capture forbids this thread a potentially
 * unsafe call now. */
int capture_forbids(const char *call);
/* The capture that an operation on s would implicitly join (legacy stream), or NULL. */
struct stream *implicit_capture(struct stream *s);

/* Entry guard of every API function: in a forked child or after exit nothing reaches the device. */
#define ENTER(name)                                                                                \
    do {                                                                                           \
        if (sim_child) {                                                                           \
            sim_log("child %s", name);                                                             \
            return E_NOT_INITIALIZED;                                                              \
        }                                                                                          \
        if (sim_exited) {                                                                          \
            sim_log("late %s", name);                                                              \
            return E_DEINITIALIZED;                                                                \
        }                                                                                          \
    } while (0)

/* The guard of a call that puts work on the device: after exit that work would be lost. */
#define ENTER_WORK(name)                                                                           \
    do {                                                                                           \
        if (sim_exited && !sim_child) {                                                            \
            sim_log("violation %s after the driver's exit handler: its work is lost", name);       \
            return E_DEINITIALIZED;                                                                \
        }                                                                                          \
        ENTER(name);                                                                               \
    } while (0)

#endif
