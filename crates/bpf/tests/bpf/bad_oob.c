/* Rejected: reads past the end of a map value (value is 4 bytes, the read is at offset 16). */
#include "xpreempt_bpf.h"

XP_MAP(prio, XP_MAP_TYPE_HASH, __u64, __s32, 16);

SEC("xpreempt/task_init")
void task_init(struct xp_task_init_ctx *ctx)
{
	__u64 id = ctx->queue_id;
	__s32 *p = xp_map_lookup_elem(&prio, &id);
	if (p)
		ctx->priority = p[4];
}
