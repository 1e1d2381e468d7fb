//! Same-context and MPS mode: the queues of one device get CUDA stream priorities from their
//! logical priorities, remapped over the device's whole range whenever the set of active logical
//! priorities changes. A queue that moves keeps its order (`CudaQueue::set_stream_priority`).

use crate::driver::Device;
use crate::error::Result;
use crate::priority_map::PriorityMapper;
use crate::queue::CudaQueue;
use std::sync::{Arc, Mutex, Weak};
use xpreempt_types::Priority;

pub struct StreamPriorities {
    inner: Mutex<Inner>,
}

struct Inner {
    mapper: PriorityMapper,
    queues: Vec<(Weak<CudaQueue>, Priority)>,
}

impl StreamPriorities {
    pub fn new(device: &Device) -> Result<Self> {
        let (least, greatest) = device.stream_priority_range()?;
        Ok(Self {
            inner: Mutex::new(Inner {
                mapper: PriorityMapper::new(least, greatest),
                queues: Vec::new(),
            }),
        })
    }

    /// A queue with logical priority `p` became active.
    pub fn attach(&self, q: &Arc<CudaQueue>, p: Priority) -> Result<()> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.queues.push((Arc::downgrade(q), p));
        g.mapper.activate(p);
        Self::apply(&mut g)
    }

    /// The queue went idle or away.
    pub fn detach(&self, q: &Arc<CudaQueue>) -> Result<()> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = g
            .queues
            .iter()
            .position(|(w, _)| w.as_ptr() == Arc::as_ptr(q))
        {
            let (_, p) = g.queues.remove(i);
            g.mapper.deactivate(p);
        }
        Self::apply(&mut g)
    }

    /// The stream priority a logical priority currently maps to.
    pub fn stream_priority(&self, p: Priority) -> i32 {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .mapper
            .stream_priority(p)
    }

    fn apply(g: &mut Inner) -> Result<()> {
        g.queues.retain(|(w, _)| w.strong_count() > 0);
        for (w, p) in &g.queues {
            if let Some(q) = w.upgrade() {
                q.set_stream_priority(g.mapper.stream_priority(*p))?;
            }
        }
        Ok(())
    }
}
