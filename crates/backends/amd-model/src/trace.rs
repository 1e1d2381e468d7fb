//! Chrome/Perfetto trace events: one process per mode, a track (thread) per queue and per CU
//! group, kernels as complete ("X") events, markers as instant ("i") events.
//!
//! CU-group tracks show when a queue occupies a group at all, not each workgroup: a million
//! workgroups would make a trace no viewer can open.
//!
//! A kernel that was taken off the hardware part-way shows as one span per stretch it ran, with
//! the gap between them: the gap starts when the queue was unmapped and its last wave stopped
//! (at once for a CWSR save or a reset, when the last wave drains for DRAIN), and ends when a
//! wave of the queue runs again. Stalls while the queue stays mapped are not gaps.
//!
//! Markers come from two places. The model's own are hardware transitions, named `hw-preempt`
//! (an unmap that preempts), `hws-rotate` (an unmap that makes room under oversubscription),
//! `runlist-remap` (an unmap because the runlist is executed again: a CU mask changed) and
//! `hw-resume` (a preempted queue mapped again). Whoever drives the model adds the decisions
//! (`preempt`, `resume`) and request arrivals with [`TraceBuf::marker`] under those names: the
//! counts of `preempt`/`resume` then match the scheduler's, which may stop a queue without the
//! hardware (Lv1) or ask for a transition the hardware folds into another.

use serde_json::{Value, json};
use xpreempt_types::Nanos;

#[derive(Clone, Debug)]
enum Ev {
    Span {
        tid: u32,
        name: String,
        start: Nanos,
        end: Nanos,
        args: Value,
    },
    Counter {
        name: String,
        at: Nanos,
        args: Value,
    },
    Instant {
        tid: u32,
        name: String,
        at: Nanos,
        args: Value,
    },
}

/// Tracks of CU groups come after the queue tracks.
const GROUP_TID_BASE: u32 = 1000;

/// What splits a queue's kernels: when it was off the hardware.
#[derive(Clone, Debug, Default)]
struct OffHw {
    /// Workgroups of the queue on CUs now.
    resident: u32,
    /// Unmapped since the last wave ran: the next time `resident` is 0, a gap starts.
    unmapped: bool,
    gap_since: Option<Nanos>,
    /// Closed gaps, in time order.
    gaps: Vec<(Nanos, Nanos)>,
}

#[derive(Clone, Debug, Default)]
pub struct TraceBuf {
    events: Vec<Ev>,
    queue_names: Vec<String>,
    groups: u32,
    /// Per (group, queue): running workgroups and since when the group holds the queue.
    occupancy: Vec<(u32, Nanos)>,
    off: Vec<OffHw>,
}

/// One stretch of a kernel on the hardware, as [`TraceBuf::kernel_spans`] lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSpan {
    pub queue: u32,
    pub start: Nanos,
    pub end: Nanos,
    pub dispatch: u64,
}

impl TraceBuf {
    pub fn new(groups: u32) -> Self {
        Self {
            groups,
            ..Self::default()
        }
    }

    pub fn add_queue(&mut self, name: &str) {
        self.queue_names.push(name.to_string());
        let queues = self.queue_names.len();
        let mut occ = vec![(0, 0); self.groups as usize * queues];
        // Re-lay the table for the new queue count.
        for g in 0..self.groups as usize {
            for q in 0..queues - 1 {
                occ[g * queues + q] = self.occupancy[g * (queues - 1) + q];
            }
        }
        self.occupancy = occ;
        self.off.push(OffHw::default());
    }

    /// A kernel that ran from `start` to `end`: one span per stretch between the queue's gaps.
    pub fn kernel(&mut self, queue: u32, name: &str, start: Nanos, end: Nanos, dispatch: u64) {
        let gaps = self
            .off
            .get(queue as usize)
            .map_or(&[][..], |o| &o.gaps[..]);
        let first = gaps.partition_point(|&(s, _)| s <= start);
        let inside: Vec<(Nanos, Nanos)> = gaps[first..]
            .iter()
            .take_while(|&&(_, e)| e < end)
            .copied()
            .collect();
        let parts = inside.len() + 1;
        let mut from = start;
        for (i, until) in inside
            .iter()
            .map(|&(s, e)| (s, Some(e)))
            .chain([(end, None)])
            .enumerate()
        {
            let args = if parts == 1 {
                json!({ "dispatch_id": dispatch })
            } else {
                json!({ "dispatch_id": dispatch, "part": i + 1, "of": parts })
            };
            self.events.push(Ev::Span {
                tid: queue,
                name: name.to_string(),
                start: from,
                end: until.0,
                args,
            });
            if let Some(next) = until.1 {
                from = next;
            }
        }
    }

    /// An instant marker on a queue's track. The model's own names are renamed to say they
    /// are hardware transitions (see the module's documentation).
    pub fn marker(&mut self, queue: u32, name: &str, at: Nanos, args: Value) {
        if matches!(name, "preempt" | "hws-rotate" | "runlist-remap")
            && let Some(o) = self.off.get_mut(queue as usize)
        {
            o.unmapped = true;
            if o.resident == 0 && o.gap_since.is_none() {
                o.gap_since = Some(at);
            }
        }
        let name = match name {
            "preempt" => "hw-preempt",
            "resume" => "hw-resume",
            other => other,
        };
        self.push_marker(queue, name, at, args);
    }

    /// A marker from whoever drives the model (a decision, an arrival), under its own name.
    pub fn push_marker(&mut self, queue: u32, name: &str, at: Nanos, args: Value) {
        self.events.push(Ev::Instant {
            tid: queue,
            name: name.to_string(),
            at,
            args,
        });
    }

    /// Every kernel stretch on a queue track, in the order they were recorded.
    pub fn kernel_spans(&self) -> impl Iterator<Item = KernelSpan> + '_ {
        self.events.iter().filter_map(|e| match e {
            Ev::Span {
                tid,
                start,
                end,
                args,
                ..
            } if *tid < GROUP_TID_BASE => Some(KernelSpan {
                queue: *tid,
                start: *start,
                end: *end,
                dispatch: args["dispatch_id"].as_u64().unwrap_or(0),
            }),
            _ => None,
        })
    }

    /// Every marker as (queue, name, time), in the order they were recorded.
    pub fn markers(&self) -> impl Iterator<Item = (u32, &str, Nanos)> + '_ {
        self.events.iter().filter_map(|e| match e {
            Ev::Instant { tid, name, at, .. } => Some((*tid, name.as_str(), *at)),
            _ => None,
        })
    }

    /// A counter track (Perfetto draws one graph per series).
    pub fn counter(&mut self, name: &str, at: Nanos, series: &[(&str, u32)]) {
        let args: serde_json::Map<String, Value> = series
            .iter()
            .map(|&(k, v)| (k.to_string(), json!(v)))
            .collect();
        self.events.push(Ev::Counter {
            name: name.to_string(),
            at,
            args: Value::Object(args),
        });
    }

    pub fn wg_start(&mut self, group: u32, queue: u32, at: Nanos) {
        if let Some(o) = self.off.get_mut(queue as usize) {
            if let Some(since) = o.gap_since.take() {
                o.gaps.push((since, at));
            }
            o.unmapped = false;
            o.resident += 1;
        }
        let i = self.slot(group, queue);
        let (n, since) = &mut self.occupancy[i];
        if *n == 0 {
            *since = at;
        }
        *n += 1;
    }

    pub fn wg_end(&mut self, group: u32, queue: u32, at: Nanos) {
        if let Some(o) = self.off.get_mut(queue as usize) {
            o.resident = o.resident.saturating_sub(1);
            if o.resident == 0 && o.unmapped && o.gap_since.is_none() {
                o.gap_since = Some(at);
            }
        }
        let i = self.slot(group, queue);
        let (n, since) = self.occupancy[i];
        let n = n.saturating_sub(1);
        self.occupancy[i].0 = n;
        if n == 0 && at > since {
            let name = self
                .queue_names
                .get(queue as usize)
                .cloned()
                .unwrap_or_default();
            self.events.push(Ev::Span {
                tid: GROUP_TID_BASE + group,
                name,
                start: since,
                end: at,
                args: Value::Null,
            });
        }
    }

    fn slot(&self, group: u32, queue: u32) -> usize {
        group as usize * self.queue_names.len() + queue as usize
    }

    /// The events of one run as Chrome trace objects under process `pid`.
    pub fn to_events(&self, pid: u32, process_name: &str) -> Vec<Value> {
        let mut out =
            vec![json!({"ph":"M","pid":pid,"name":"process_name","args":{"name":process_name}})];
        for (q, name) in self.queue_names.iter().enumerate() {
            out.push(json!({"ph":"M","pid":pid,"tid":q,"name":"thread_name","args":{"name":format!("queue {name}")}}));
        }
        for g in 0..self.groups {
            out.push(json!({"ph":"M","pid":pid,"tid":GROUP_TID_BASE + g,"name":"thread_name","args":{"name":format!("CU group {g}")}}));
        }
        let us = |ns: Nanos| ns as f64 / 1_000.0;
        for e in &self.events {
            out.push(match e {
                Ev::Span {
                    tid,
                    name,
                    start,
                    end,
                    args,
                } => json!({"ph":"X","pid":pid,"tid":tid,"name":name,"ts":us(*start),"dur":us(end - start),"args":args}),
                Ev::Counter { name, at, args } => {
                    json!({"ph":"C","pid":pid,"name":name,"ts":us(*at),"args":args})
                }
                Ev::Instant { tid, name, at, args } => {
                    json!({"ph":"i","s":"t","pid":pid,"tid":tid,"name":name,"ts":us(*at),"args":args})
                }
            });
        }
        out
    }
}

/// A whole trace file.
pub fn document(events: Vec<Value>) -> Value {
    json!({ "traceEvents": events, "displayTimeUnit": "ns" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_show_occupancy_spans_and_queues_have_names() {
        let mut t = TraceBuf::new(2);
        t.add_queue("train");
        t.add_queue("infer");
        t.wg_start(1, 1, 10);
        t.wg_start(1, 1, 12);
        t.wg_end(1, 1, 20);
        t.wg_end(1, 1, 30);
        t.kernel(0, "k", 0, 5, 0);
        t.marker(0, "preempt", 3, json!({}));
        t.push_marker(0, "preempt", 3, json!({}));
        let ev = t.to_events(7, "lv3");
        let spans: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(spans.len(), 2);
        assert!(
            spans
                .iter()
                .any(|e| e["tid"] == 1001 && e["name"] == "infer" && e["dur"] == 0.02)
        );
        // The model's marker says it is the hardware's; the driver's keeps its name.
        let named = |n: &str| {
            ev.iter()
                .filter(|e| e["ph"] == "i" && e["name"] == n)
                .count()
        };
        assert_eq!((named("hw-preempt"), named("preempt")), (1, 1));
        assert!(ev.iter().any(|e| e["args"]["name"] == "queue train"));
    }

    #[test]
    fn a_kernel_splits_where_its_queue_was_off_the_hardware() {
        let mut t = TraceBuf::new(1);
        t.add_queue("q");
        // Two waves; unmapped at 10 (DRAIN), the last wave stops at 14, back at 30.
        t.wg_start(0, 0, 0);
        t.wg_start(0, 0, 1);
        t.wg_end(0, 0, 8);
        t.marker(0, "preempt", 10, json!({}));
        t.wg_end(0, 0, 14);
        t.marker(0, "resume", 29, json!({}));
        t.wg_start(0, 0, 30);
        t.wg_end(0, 0, 40);
        // A stall while mapped (no wave from 40 to 45) is not a gap.
        t.wg_start(0, 0, 45);
        t.wg_end(0, 0, 50);
        t.kernel(0, "k", 0, 50, 3);
        let parts: Vec<(Nanos, Nanos)> = t.kernel_spans().map(|k| (k.start, k.end)).collect();
        assert_eq!(parts, [(0, 14), (30, 50)]);
        assert!(t.kernel_spans().all(|k| k.dispatch == 3 && k.queue == 0));
        // A kernel that started after the gap is whole.
        t.kernel(0, "k", 30, 50, 4);
        assert_eq!(t.kernel_spans().filter(|k| k.dispatch == 4).count(), 1);
        // CWSR: the waves stop before the marker; the gap starts at the marker.
        t.wg_start(0, 0, 60);
        t.wg_end(0, 0, 70);
        t.marker(0, "hws-rotate", 70, json!({}));
        t.wg_start(0, 0, 90);
        t.wg_end(0, 0, 95);
        t.kernel(0, "k", 60, 95, 5);
        let parts: Vec<(Nanos, Nanos)> = t
            .kernel_spans()
            .filter(|k| k.dispatch == 5)
            .map(|k| (k.start, k.end))
            .collect();
        assert_eq!(parts, [(60, 70), (90, 95)]);
    }
}
