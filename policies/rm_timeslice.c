/* Per-process timeslice at the NVIDIA driver (the shim's RM hooks).
 *
 * When libcuda creates a compute channel group for process P, task_init gives it the timeslice
 * process_timeslice_us[P] (microseconds); the shim applies it with the driver's SET_TIMESLICE and
 * rewrites libcuda's own SET_TIMESLICE to it. Processes without an entry, and XQueues, keep their
 * defaults. given_us records what each group got, for the operator:
 *
 *   xpreempt policy --daemon map set process_timeslice_us 4242 10000   # pid 4242: 10 ms
 *   xpreempt policy --daemon map dump given_us
 */
#include "xpreempt_bpf.h"

XP_MAP(process_timeslice_us, XP_MAP_TYPE_HASH, __u32, __u64, 1024);
/* channel group (queue id) -> the timeslice it was given, in microseconds */
XP_MAP(given_us, XP_MAP_TYPE_HASH, __u64, __u64, 1024);

SEC("xpreempt/task_init")
void task_init(struct xp_task_init_ctx *ctx)
{
	__u64 id = ctx->queue_id;
	__u32 pid = ctx->process_id;

	if (!XP_IS_RM_QUEUE(id))
		return;
	__u64 *us = xp_map_lookup_elem(&process_timeslice_us, &pid);
	if (!us || !*us)
		return;
	__u64 v = *us;
	ctx->timeslice_ns = v * 1000;
	xp_map_update_elem(&given_us, &id, &v, XP_ANY);
	xp_trace("pid %u: channel group %llx gets %llu us", pid, id, v);
}

SEC("xpreempt/task_destroy")
void task_destroy(struct xp_task_destroy_ctx *ctx)
{
	__u64 id = ctx->queue_id;
	xp_map_delete_elem(&given_us, &id);
}

char LICENSE[] SEC("license") = "Apache-2.0";
