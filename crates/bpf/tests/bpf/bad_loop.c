/* Rejected: an infinite loop (a back-edge in the control-flow graph). The helper call keeps
 * clang from deleting the loop. */
#include "xpreempt_bpf.h"

SEC("xpreempt/task_init")
void task_init(struct xp_task_init_ctx *ctx)
{
	for (;;)
		ctx->priority += (int)xp_ktime_get_ns();
}
