/* Fixed priorities from maps, configured by the CLI:
 *   xpreempt policy map set priorities QUEUE PRIORITY          (by queue id, __u64 -> __s32)
 *   xpreempt policy map set process_priorities PID PRIORITY    (by process, __u32 -> __s32)
 * A queue's own entry wins over its process's; a queue in neither keeps its priority.
 */
#include "xpreempt_bpf.h"

XP_MAP(priorities, XP_MAP_TYPE_HASH, __u64, __s32, 4096);
XP_MAP(process_priorities, XP_MAP_TYPE_HASH, __u32, __s32, 4096);

SEC("xpreempt/task_init")
void task_init(struct xp_task_init_ctx *ctx)
{
	__u64 id = ctx->queue_id;
	__s32 *p = xp_map_lookup_elem(&priorities, &id);
	if (p) {
		ctx->priority = *p;
		return;
	}
	__u32 pid = ctx->process_id;
	p = xp_map_lookup_elem(&process_priorities, &pid);
	if (p)
		ctx->priority = *p;
}

char LICENSE[] SEC("license") = "Apache-2.0";
