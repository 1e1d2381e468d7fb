/* Rejected: the seed's NVIDIA section name is not one of xpreempt's hooks. */
#include "xpreempt_bpf.h"

SEC("gpu_sched/task_init")
void task_init(struct xp_task_init_ctx *ctx)
{
	ctx->priority = 5;
}
