/* An LC/BE policy on xpreempt's hooks.
 *
 * A queue is latency-critical (LC) or best-effort (BE):
 *   - from task_type_map (queue id -> 1 LC / 0 BE), which the CLI may set
 *     (`xpreempt policy map set task_type_map QUEUE 1`) and work_submit updates;
 *   - else from the queue's LC/BE hint;
 *   - else LC if its priority is above 0.
 * LC: long timeslice (10 s), interleave LOW (runs alone), priority raised by LC_BOOST.
 * BE: short timeslice (200 us), interleave HIGH, priority unchanged.
 * Adaptive: over windows of at least 1 s, a queue submitting more than 1000 commands/s becomes
 * LC and one submitting fewer than 100/s becomes BE. task_init is the only hook that sets
 * parameters; the scheduler runs it again whenever an idle queue gets work, so a learned class
 * takes effect at the queue's next burst without re-creating it.
 */
#include "xpreempt_bpf.h"

#define LC_TIMESLICE_NS 10000000000ull
#define BE_TIMESLICE_NS 200000ull
#define LC_BOOST 1000
#define WINDOW_NS 1000000000ull
#define LC_RATE 1000
#define BE_RATE 100

struct task_stats {
	__u64 submit_count;
	__u64 window_start;
	__u64 last_submit_time;
};

XP_MAP(task_type_map, XP_MAP_TYPE_HASH, __u64, __u32, 10000);
XP_MAP(task_stats_map, XP_MAP_TYPE_HASH, __u64, struct task_stats, 10000);

SEC("xpreempt/task_init")
void task_init(struct xp_task_init_ctx *ctx)
{
	__u64 id = ctx->queue_id;
	__u32 *known = xp_map_lookup_elem(&task_type_map, &id);
	__u32 lc;

	if (known)
		lc = *known == 1;
	else if (ctx->hint_class != XP_CLASS_UNSET)
		lc = ctx->hint_class == XP_CLASS_LC;
	else
		lc = ctx->default_priority > 0;

	if (lc) {
		ctx->timeslice_ns = LC_TIMESLICE_NS;
		ctx->interleave = XP_INTERLEAVE_LOW;
		ctx->priority = ctx->default_priority + LC_BOOST;
		ctx->class = XP_CLASS_LC;
	} else {
		ctx->timeslice_ns = BE_TIMESLICE_NS;
		ctx->interleave = XP_INTERLEAVE_HIGH;
		ctx->class = XP_CLASS_BE;
	}
	/* Copy engines overlap well with anything (the engine-type rule). */
	if (ctx->engine_type == XP_ENGINE_COPY)
		ctx->interleave = XP_INTERLEAVE_HIGH;

	struct task_stats stats = {
		.submit_count = 0,
		.window_start = xp_ktime_get_ns(),
		.last_submit_time = 0,
	};
	xp_map_update_elem(&task_stats_map, &id, &stats, XP_NOEXIST);
}

SEC("xpreempt/schedule")
void schedule(struct xp_schedule_ctx *ctx)
{
	ctx->allow_schedule = 1;
}

SEC("xpreempt/work_submit")
void work_submit(struct xp_work_submit_ctx *ctx)
{
	if (ctx->event != XP_WORK_SUBMIT)
		return;
	__u64 id = ctx->queue_id;
	struct task_stats *s = xp_map_lookup_elem(&task_stats_map, &id);
	if (!s)
		return;

	__u64 now = ctx->timestamp_ns;
	s->submit_count++;
	s->last_submit_time = now;
	if (now < s->window_start) {
		s->window_start = now;
		return;
	}
	__u64 delta = now - s->window_start;
	if (delta >= WINDOW_NS) {
		__u64 rate = s->submit_count * 1000000000ull / delta;
		__u32 type;
		if (rate > LC_RATE) {
			type = 1;
			xp_map_update_elem(&task_type_map, &id, &type, XP_ANY);
		} else if (rate < BE_RATE) {
			type = 0;
			xp_map_update_elem(&task_type_map, &id, &type, XP_ANY);
		}
		s->window_start = now;
		s->submit_count = 0;
	}
}

SEC("xpreempt/task_destroy")
void task_destroy(struct xp_task_destroy_ctx *ctx)
{
	__u64 id = ctx->queue_id;
	xp_map_delete_elem(&task_type_map, &id);
	xp_map_delete_elem(&task_stats_map, &id);
}

char LICENSE[] SEC("license") = "Apache-2.0";
