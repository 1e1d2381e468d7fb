/*
 * libxpreempt: an application changes its own scheduling under xpreempt's daemon (xpreemptd),
 * request by request: raise the priority of its queues before a latency-critical request and
 * lower it after, or give the scheduler a deadline, a utilization share or a timeslice.
 *
 * Link with -lxpreempt (libxpreempt.so, built by `cargo build --release -p xpreempt-client`).
 * The daemon is found at $XPREEMPT_SOCKET, else $XDG_RUNTIME_DIR/xpreempt.sock, else
 * /run/xpreempt/xpreempt.sock. Each call is one round trip to the daemon (tens of µs) and applies
 * to every queue of the calling process at once. Calls are thread-safe.
 *
 * Every function returns the number of queues changed (>= 0), or -1 on failure, when
 * xpreempt_last_error() says why (per thread, valid until the next failure on that thread).
 */
#ifndef XPREEMPT_H
#define XPREEMPT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Scheduling hints. A zero field is unset; latency_critical: -1 unset, 0 best-effort, 1 LC. */
struct xpreempt_hints {
	uint64_t deadline_ns; /* absolute, on the daemon's clock */
	double utilization_share; /* (0, 1] under the bandwidth policy */
	uint64_t timeslice_ns; /* round-robin turns, 1 ns .. 60 s */
	int latency_critical;
};

/* Logical priority of all of this process's queues: larger runs first; any int. */
int xpreempt_set_priority(int priority);

/* Replaces the hints of all of this process's queues. */
int xpreempt_set_hints(const struct xpreempt_hints *hints);

const char *xpreempt_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* XPREEMPT_H */
