/* Rejected: writes an input field of the context. */
#include "xpreempt_bpf.h"

SEC("xpreempt/task_init")
void task_init(struct xp_task_init_ctx *ctx)
{
	ctx->queue_id = 0;
}
