/* Admission at the NVIDIA driver (the shim's RM hooks): at most N compute channel groups per
 * device run at a time.
 *
 * libcuda enables a new channel group with GPFIFO_SCHEDULE; schedule decides whether it may now.
 * A group holds its device slot from its admission until it is destroyed (freed, or its process
 * gone); a refused group's enable waits in the shim (bounded: XPREEMPT_RM_ADMIT_WAIT_MS) and asks
 * again. N is config[0] (default 1): `xpreempt policy map set config 0 2`. XQueues are always
 * admitted. refusals counts the refused asks of each waiting group, for the operator.
 */
#include "xpreempt_bpf.h"

#define DEFAULT_MAX_GROUPS 1

XP_MAP(config, XP_MAP_TYPE_ARRAY, __u32, __u64, 1);
/* channel group (queue id) -> device, for groups holding a slot */
XP_MAP(holders, XP_MAP_TYPE_HASH, __u64, __u32, 1024);
/* device -> slots in use */
XP_MAP(held, XP_MAP_TYPE_HASH, __u32, __u64, 64);
/* channel group -> refused asks so far */
XP_MAP(refusals, XP_MAP_TYPE_HASH, __u64, __u64, 1024);

SEC("xpreempt/schedule")
void schedule(struct xp_schedule_ctx *ctx)
{
	__u64 id = ctx->queue_id;
	__u32 dev = ctx->device;

	ctx->allow_schedule = 1;
	if (!XP_IS_RM_QUEUE(id))
		return;
	if (xp_map_lookup_elem(&holders, &id))
		return;

	__u32 zero = 0;
	__u64 max = DEFAULT_MAX_GROUPS;
	__u64 *cfg = xp_map_lookup_elem(&config, &zero);
	if (cfg && *cfg)
		max = *cfg;
	__u64 *count = xp_map_lookup_elem(&held, &dev);
	__u64 used = count ? *count : 0;
	if (used >= max) {
		ctx->allow_schedule = 0;
		__u64 *r = xp_map_lookup_elem(&refusals, &id);
		__u64 n = r ? *r + 1 : 1;
		xp_map_update_elem(&refusals, &id, &n, XP_ANY);
		return;
	}
	used++;
	xp_map_update_elem(&held, &dev, &used, XP_ANY);
	xp_map_update_elem(&holders, &id, &dev, XP_ANY);
}

SEC("xpreempt/task_destroy")
void task_destroy(struct xp_task_destroy_ctx *ctx)
{
	__u64 id = ctx->queue_id;
	__u32 *dev = xp_map_lookup_elem(&holders, &id);
	if (dev) {
		__u32 d = *dev;
		__u64 *count = xp_map_lookup_elem(&held, &d);
		if (count && *count > 0)
			*count -= 1;
		xp_map_delete_elem(&holders, &id);
	}
	xp_map_delete_elem(&refusals, &id);
}

char LICENSE[] SEC("license") = "Apache-2.0";
