/* Every scenario of the test application: X(name on the command line, function). */
#ifndef SCENARIOS_H
#define SCENARIOS_H

#define SCENARIOS(X)                                                                               \
    X("stream-sync", stream_sync)                                                                  \
    X("stream-query", stream_query)                                                                \
    X("ctx-sync", ctx_sync)                                                                        \
    X("event-sync", event_sync)                                                                    \
    X("wait-event", wait_event)                                                                    \
    X("legacy-blocking", legacy_blocking)                                                          \
    X("rotation", rotation)                                                                        \
    X("nonblocking-exempt", nonblocking_exempt)                                                    \
    X("per-thread", per_thread)                                                                    \
    X("sync-memory", sync_memory)                                                                  \
    X("free-memory", free_memory)                                                                  \
    X("unload", unload)                                                                            \
    X("ctx-teardown", ctx_teardown)                                                                \
    X("runtime-reset", runtime_reset)                                                              \
    X("capture", capture)                                                                          \
    X("capture-beside-work", capture_beside_work)                                                  \
    X("captures-in-threads", captures_in_threads)                                                  \
    X("graph-legacy", graph_legacy)                                                                \
    X("graph-legacy-reset", graph_legacy_reset)                                                    \
    X("stream-destroy", stream_destroy)                                                            \
    X("exit-pending", exit_pending)                                                                \
    X("fork-child", fork_child)                                                                    \
    X("sticky-error", sticky_error)                                                                \
    X("sticky-elsewhere", sticky_elsewhere)                                                        \
    X("threads", threads)                                                                          \
    X("hold", hold)                                                                                \
    X("hold-late", hold_late)                                                                      \
    X("suspended", suspended)                                                                      \
    X("per-thread-held", per_thread_held)                                                          \
    X("inherit", inherit)                                                                          \
    X("gate-legacy", gate_legacy)                                                                  \
    X("gate-record", gate_record)                                                                  \
    X("gate-own-legacy", gate_own_legacy)                                                          \
    X("gate-set-async", gate_set_async)                                                            \
    X("guard-basic", guard_basic)                                                                  \
    X("guard-suspend", guard_suspend)                                                              \
    X("guard-unload", guard_unload)

#define DECLARE(name, fn) void fn(void);
SCENARIOS(DECLARE)
#undef DECLARE

#endif
