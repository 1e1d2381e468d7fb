//! Chrome/Perfetto trace events: one process per mode, a track (thread) per queue and per CU
//! group, kernels as complete ("X") events, preempt/resume as instant ("i") markers.
//!
//! CU-group tracks show when a queue occupies a group at all, not each workgroup: a million
//! workgroups would make a trace no viewer can open.

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

#[derive(Clone, Debug, Default)]
pub struct TraceBuf {
    events: Vec<Ev>,
    queue_names: Vec<String>,
    groups: u32,
    /// Per (group, queue): running workgroups and since when the group holds the queue.
    occupancy: Vec<(u32, Nanos)>,
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
    }

    pub fn kernel(&mut self, queue: u32, name: &str, start: Nanos, end: Nanos, dispatch: u64) {
        self.events.push(Ev::Span {
            tid: queue,
            name: name.to_string(),
            start,
            end,
            args: json!({ "dispatch_id": dispatch }),
        });
    }

    pub fn marker(&mut self, queue: u32, name: &str, at: Nanos, args: Value) {
        self.events.push(Ev::Instant {
            tid: queue,
            name: name.to_string(),
            at,
            args,
        });
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
        let i = self.slot(group, queue);
        let (n, since) = &mut self.occupancy[i];
        if *n == 0 {
            *since = at;
        }
        *n += 1;
    }

    pub fn wg_end(&mut self, group: u32, queue: u32, at: Nanos) {
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
        let ev = t.to_events(7, "lv3");
        let spans: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(spans.len(), 2);
        assert!(
            spans
                .iter()
                .any(|e| e["tid"] == 1001 && e["name"] == "infer" && e["dur"] == 0.02)
        );
        assert!(ev.iter().any(|e| e["ph"] == "i" && e["name"] == "preempt"));
        assert!(ev.iter().any(|e| e["args"]["name"] == "queue train"));
    }
}
