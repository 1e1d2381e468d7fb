/* Exercises trace printing and get_queue_info: task_init copies the queue's own info, as the
 * runtime saw it, into the `seen` map; work_submit stores the submit count. */
#include "xpreempt_bpf.h"

XP_MAP(seen, XP_MAP_TYPE_HASH, __u64, struct xp_queue_info, 64);

SEC("xpreempt/work_submit")
void work_submit(struct xp_work_submit_ctx *ctx)
{
	__u64 id = ctx->queue_id;
	struct xp_queue_info info = {};
	if (xp_get_queue_info(id, &info, sizeof(info)) == 0) {
		xp_map_update_elem(&seen, &id, &info, XP_ANY);
		xp_trace("queue %llu submits %llu kind %u", id, info.submits, ctx->kind);
	}
}
