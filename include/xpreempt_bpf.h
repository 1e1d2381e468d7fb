/* xpreempt_bpf.h: what an xpreempt eBPF policy sees.
 *
 * A policy is an ELF object built with `clang -target bpf -mcpu=v3 -O2 -c policy.c`. Each hook is
 * a function in its own section:
 *
 *   SEC("xpreempt/task_init")    void f(struct xp_task_init_ctx *ctx);     a queue is created
 *   SEC("xpreempt/schedule")     void f(struct xp_schedule_ctx *ctx);      a queue asks to run
 *   SEC("xpreempt/work_submit")  void f(struct xp_work_submit_ctx *ctx);   a command is submitted / completes
 *   SEC("xpreempt/task_destroy") void f(struct xp_task_destroy_ctx *ctx);  a queue is gone
 *
 * These are four hook points with their context fields, adapted to queues. The
 * Rust side (crates/bpf/src/ctx.rs) declares the same structs; a test compiles this
 * header and compares every offset. Fields are ordered so that no struct has padding.
 *
 * Maps use the legacy `maps` section: one `struct xp_map_def` per map, declared with XP_MAP.
 * Global variables (.data/.bss/.rodata) are not supported: keep state in maps.
 * Loops must be unrolled (no back edges), and a program may not exceed the per-call instruction
 * budget along any path (4096 by default).
 */
#ifndef XPREEMPT_BPF_H
#define XPREEMPT_BPF_H

typedef unsigned char __u8;
typedef unsigned int __u32;
typedef int __s32;
typedef unsigned long long __u64;
typedef long long __s64;

#define SEC(name) __attribute__((section(name), used))

/* Interleave levels (LOW/MEDIUM/HIGH), and the scheduler limit each maps to:
 * "at most N other queues may run alongside this one".
 *   XP_INTERLEAVE_LOW    -> 0 others (the queue runs alone)
 *   XP_INTERLEAVE_MEDIUM -> 2 others
 *   XP_INTERLEAVE_HIGH   -> no limit
 *   XP_INTERLEAVE_OTHERS(n) -> exactly n others (n < 65536)
 * 0 in an output field means "leave unchanged". */
#define XP_INTERLEAVE_LOW 1u
#define XP_INTERLEAVE_MEDIUM 2u
#define XP_INTERLEAVE_HIGH 3u
#define XP_INTERLEAVE_OTHERS(n) (0x10000u | (__u32)(n))

/* Engine types (every queue the scheduler creates today is a compute queue). */
#define XP_ENGINE_COMPUTE 0u
#define XP_ENGINE_COPY 1u

/* Latency class, in task_init's `hint_class` (from the queue's hints) and `class` (output). */
#define XP_CLASS_UNSET 0u
#define XP_CLASS_BE 1u
#define XP_CLASS_LC 2u

/* Command kinds in work_submit's `kind` (xpreempt_core::OpKind). */
#define XP_OP_KERNEL 0u
#define XP_OP_MEMCPY 1u
#define XP_OP_MEMSET 2u
#define XP_OP_EVENT_RECORD 3u
#define XP_OP_EVENT_WAIT 4u
#define XP_OP_HOST_CALLBACK 5u
#define XP_OP_BARRIER 6u

/* RM hooks (the shim's, at the NVIDIA driver's own events): the "queue" is a compute channel group
 * (TSG) of a process, and its queue_id carries the process id above bit 32, so it never equals an
 * XQueue's id (those fit in 32 bits):
 *   queue_id = pid << 32 | device << 24 | hardware TSG id (24 bits)
 * task_init fires when libcuda creates the group (default_timeslice_ns: what the driver reports,
 * default_interleave: XP_INTERLEAVE_MEDIUM, the driver's default; default_priority:
 * XPREEMPT_PRIORITY); its timeslice_ns (rounded to microseconds) and interleave (LOW/MEDIUM/HIGH,
 * passed to the driver's level of the same name) are applied with the driver's controls.
 * schedule fires when libcuda enables the group (GPFIFO_SCHEDULE): pending = the group's channels,
 * running = other groups admitted on the device; 0 delays the enable (bounded wait).
 * work_submit fires per channel token (XP_WORK_CHANNEL) and, where launches are seen, per launch
 * (XP_WORK_SUBMIT). task_destroy fires when the group is freed or its process goes away. */
#define XP_IS_RM_QUEUE(id) (((id) >> 32) != 0)
#define XP_RM_PID(id) ((__u32)((id) >> 32))
#define XP_RM_DEVICE(id) ((__u32)(((id) >> 24) & 0xff))
#define XP_RM_TSG(id) ((__u32)((id) & 0xffffff))
/* A work-submit token (Ampere, Hopper): channel id in bits 11:0, runlist id in bits 22:16. */
#define XP_RM_TOKEN_CHANNEL(t) ((__u32)((t) & 0xfff))
#define XP_RM_TOKEN_RUNLIST(t) ((__u32)(((t) >> 16) & 0x7f))

/* task_init: a queue is created. Inputs first, then outputs (the only writable bytes). */
struct xp_task_init_ctx {
	__u64 queue_id;
	__u32 process_id;
	__u32 device;
	__u32 engine_type;
	__u32 default_interleave; /* encoded as the outputs below; XP_INTERLEAVE_HIGH when unlimited */
	__u64 default_timeslice_ns; /* 0 when the queue has no timeslice hint */
	__s32 default_priority;
	__u32 hint_class; /* XP_CLASS_* from the queue's latency_critical hint */
	/* outputs */
	__s32 priority; /* starts as default_priority */
	__u32 interleave; /* 0: unchanged */
	__u64 timeslice_ns; /* 0: unchanged */
	__u32 class; /* XP_CLASS_*: sets the LC/BE hint; 0: unchanged */
	__u32 reserved;
};

/* schedule: a queue with `pending` commands asks to run while `running` queues run. */
struct xp_schedule_ctx {
	__u64 queue_id;
	__u32 device;
	__u32 pending;
	__u32 running;
	/* output: 1 admits (the default), 0 refuses (the submitter backs off and retries) */
	__u32 allow_schedule;
};

/* work_submit's `event`. */
#define XP_WORK_SUBMIT 0u /* a command was submitted; token = its sequence number */
#define XP_WORK_COMPLETE 1u /* commands completed; token = watermark (all below it done), kind = 0 */
#define XP_WORK_CHANNEL 2u /* RM hooks: a channel of the group got its work-submit token (token = it) */

/* work_submit: a command was submitted, or a queue's commands completed up to a point. */
struct xp_work_submit_ctx {
	__u64 queue_id;
	__u32 kind; /* XP_OP_* */
	__u32 device;
	__u64 token;
	__u64 timestamp_ns; /* the scheduler's clock */
	__u32 event; /* XP_WORK_* */
	__u32 reserved;
};

/* task_destroy: a queue is gone. */
struct xp_task_destroy_ctx {
	__u64 queue_id;
	__u64 total_runtime_ns;
};

/* What xp_get_queue_info fills in: what the runtime has seen of a queue. */
struct xp_queue_info {
	__u64 queue_id;
	__u32 process_id;
	__u32 device;
	__s32 priority;
	__u32 interleave;
	__u64 timeslice_ns;
	__u64 submits;
	__u64 last_submit_ns;
};

/* Maps: the legacy definition, 20 bytes each, in section "maps". */
#define XP_MAP_TYPE_HASH 1u
#define XP_MAP_TYPE_ARRAY 2u

struct xp_map_def {
	__u32 type;
	__u32 key_size;
	__u32 value_size;
	__u32 max_entries;
	__u32 map_flags;
};

#define XP_MAP(name, type_, key_t, value_t, max)                                                \
	struct xp_map_def name SEC("maps") = {                                                  \
		.type = (type_),                                                                \
		.key_size = sizeof(key_t),                                                      \
		.value_size = sizeof(value_t),                                                  \
		.max_entries = (max),                                                           \
		.map_flags = 0,                                                                 \
	}

/* Update flags (as in Linux). */
#define XP_ANY 0ull
#define XP_NOEXIST 1ull
#define XP_EXIST 2ull

/* Helper ids: Linux's numbers where Linux has the helper. */
#define XP_HELPER_MAP_LOOKUP_ELEM 1
#define XP_HELPER_MAP_UPDATE_ELEM 2
#define XP_HELPER_MAP_DELETE_ELEM 3
#define XP_HELPER_KTIME_GET_NS 5
#define XP_HELPER_TRACE_PRINTK 6
#define XP_HELPER_GET_QUEUE_INFO 100

static void *(*xp_map_lookup_elem)(void *map, const void *key) = (void *)XP_HELPER_MAP_LOOKUP_ELEM;
static long (*xp_map_update_elem)(void *map, const void *key, const void *value,
				  __u64 flags) = (void *)XP_HELPER_MAP_UPDATE_ELEM;
static long (*xp_map_delete_elem)(void *map, const void *key) = (void *)XP_HELPER_MAP_DELETE_ELEM;
/* The scheduler's clock (virtual in the simulator). */
static __u64 (*xp_ktime_get_ns)(void) = (void *)XP_HELPER_KTIME_GET_NS;
/* printf-like into the scheduler's log (tracing target xpreempt_bpf::trace): %d %i %u %x %ld
 * %lu %lx %lld %llu %llx %%, at most three arguments. */
static long (*xp_trace_printk)(const char *fmt, __u32 fmt_size, ...) = (void *)XP_HELPER_TRACE_PRINTK;
/* 0 and *out filled, or -2 (ENOENT) for a queue the runtime has not seen. */
static long (*xp_get_queue_info)(__u64 queue_id, struct xp_queue_info *out,
				 __u32 size) = (void *)XP_HELPER_GET_QUEUE_INFO;

/* The format lives on the stack: the loader does not support .rodata. */
#define xp_trace(fmt, ...)                                                                     \
	({                                                                                     \
		char ____fmt[] = fmt;                                                          \
		xp_trace_printk(____fmt, sizeof(____fmt), ##__VA_ARGS__);                      \
	})

#endif /* XPREEMPT_BPF_H */
