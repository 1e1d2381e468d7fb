/* Rejected: a `gpu_sched/` section name, which is not one of xpreempt's hooks. */
#include "xpreempt_bpf.h"

SEC("gpu_sched/task_init")
void task_init(struct xp_task_init_ctx *ctx)
{
	ctx->priority = 5;
}
