/* Admission control: at most N latency-critical (LC) queues per device.
 *
 * A queue is LC if its hint says so, or if its priority is above 0 (recorded at task_init in
 * queue_class). When an LC queue asks to run (schedule) and its device already holds N LC slots,
 * admission is refused: the submitter gets busy-retry and tries again later. A queue holds its
 * slot from its first admission until it is destroyed. N is config[0] (default 1), settable with
 * `xpreempt policy map set config 0 N`.
 */
#include "xpreempt_bpf.h"

#define DEFAULT_MAX_LC 1

XP_MAP(config, XP_MAP_TYPE_ARRAY, __u32, __u64, 4);
/* queue id -> 1 if LC */
XP_MAP(queue_class, XP_MAP_TYPE_HASH, __u64, __u32, 10000);
/* queue id -> device, for LC queues holding a slot */
XP_MAP(lc_slots, XP_MAP_TYPE_HASH, __u64, __u32, 10000);
/* device -> LC slots in use */
XP_MAP(lc_count, XP_MAP_TYPE_HASH, __u32, __u64, 256);

SEC("xpreempt/task_init")
void task_init(struct xp_task_init_ctx *ctx)
{
	__u64 id = ctx->queue_id;
	__u32 lc = ctx->hint_class == XP_CLASS_LC ||
		   (ctx->hint_class == XP_CLASS_UNSET && ctx->default_priority > 0);
	xp_map_update_elem(&queue_class, &id, &lc, XP_ANY);
}

SEC("xpreempt/schedule")
void schedule(struct xp_schedule_ctx *ctx)
{
	__u64 id = ctx->queue_id;
	__u32 dev = ctx->device;
	__u32 *lc = xp_map_lookup_elem(&queue_class, &id);

	ctx->allow_schedule = 1;
	if (!lc || !*lc)
		return;
	if (xp_map_lookup_elem(&lc_slots, &id))
		return; /* already holds a slot */

	__u32 zero = 0;
	__u64 max = DEFAULT_MAX_LC;
	__u64 *cfg = xp_map_lookup_elem(&config, &zero);
	if (cfg && *cfg)
		max = *cfg;

	__u64 *count = xp_map_lookup_elem(&lc_count, &dev);
	__u64 used = count ? *count : 0;
	if (used >= max) {
		ctx->allow_schedule = 0;
		xp_trace("refuse LC queue %llu on device %u: %llu slots in use", id, dev, used);
		return;
	}
	used++;
	xp_map_update_elem(&lc_count, &dev, &used, XP_ANY);
	xp_map_update_elem(&lc_slots, &id, &dev, XP_ANY);
}

SEC("xpreempt/task_destroy")
void task_destroy(struct xp_task_destroy_ctx *ctx)
{
	__u64 id = ctx->queue_id;
	__u32 *dev = xp_map_lookup_elem(&lc_slots, &id);
	if (dev) {
		__u32 d = *dev;
		__u64 *count = xp_map_lookup_elem(&lc_count, &d);
		if (count && *count > 0)
			*count -= 1;
		xp_map_delete_elem(&lc_slots, &id);
	}
	xp_map_delete_elem(&queue_class, &id);
}

char LICENSE[] SEC("license") = "Apache-2.0";
