/* Rejected: uses a map lookup's result without checking it for NULL. */
#include "xpreempt_bpf.h"

XP_MAP(prio, XP_MAP_TYPE_HASH, __u64, __s32, 16);

SEC("xpreempt/task_init")
void task_init(struct xp_task_init_ctx *ctx)
{
	__u64 id = ctx->queue_id;
	__s32 *p = xp_map_lookup_elem(&prio, &id);
	ctx->priority = *p;
}
