//! Compute units: wave slots per CU, placement of workgroups under a CU mask, and the table of
//! running workgroups. On a multi-XCC part every XCC owns a contiguous share of the CUs and
//! places only its own workgroups there (each XCC runs the queue from its own HQD). A stopped workgroup's completion event stays in the event queue; its
//! generation no longer matches, so the event is ignored.

use xpreempt_types::Nanos;

/// A set of CUs a queue may use (the per-queue CU mask).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CuMask(Vec<u64>);

impl CuMask {
    pub fn all(cus: u32) -> Self {
        Self::from_range(0, cus, cus)
    }

    /// CUs `first..first+count` of `cus`.
    pub fn from_range(first: u32, count: u32, cus: u32) -> Self {
        let mut words = vec![0u64; cus.div_ceil(64) as usize];
        for cu in first..first.saturating_add(count).min(cus) {
            words[(cu / 64) as usize] |= 1 << (cu % 64);
        }
        Self(words)
    }

    /// CU `i` is bit `i % 64` of word `i / 64`; words past the device's CUs are dropped.
    pub fn from_words(mut words: Vec<u64>, cus: u32) -> Self {
        words.resize(cus.div_ceil(64) as usize, 0);
        if !cus.is_multiple_of(64)
            && let Some(last) = words.last_mut()
        {
            *last &= (1u64 << (cus % 64)) - 1;
        }
        Self(words)
    }

    pub fn words(&self) -> &[u64] {
        &self.0
    }

    pub fn contains(&self, cu: u32) -> bool {
        self.0
            .get((cu / 64) as usize)
            .is_some_and(|w| w & (1 << (cu % 64)) != 0)
    }

    pub fn count(&self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }
}

#[derive(Clone, Copy, Debug)]
pub struct RunningWg {
    pub queue: u32,
    pub dispatch: u64,
    pub wg: u32,
    pub cu: u32,
    pub waves: u32,
    pub start: Nanos,
    pub end: Nanos,
    pub generation: u32,
    pub live: bool,
}

pub struct Compute {
    free_waves: Vec<u32>,
    waves_per_cu: u32,
    free_total: u64,
    /// XCC `x` owns CUs `xcc_first[x]..xcc_first[x + 1]`.
    xcc_first: Vec<u32>,
    cu_xcc: Vec<u32>,
    xcc_free: Vec<u64>,
    /// Round-robin placement cursor of each XCC.
    cursors: Vec<u32>,
    slots: Vec<RunningWg>,
    free_slots: Vec<u32>,
    groups: u32,
    /// When each CU last went from idle to running something.
    busy_since: Vec<Nanos>,
    /// CU time spent with at least one wave resident (running or being saved), over busy
    /// periods that have ended: what the GPU's utilization is measured from.
    busy_ns: u128,
}

impl Compute {
    /// `xccs` is clamped to 1..=cus so that every XCC has at least one CU.
    pub fn new(cus: u32, waves_per_cu: u32, groups: u32, xccs: u32) -> Self {
        let xccs = xccs.clamp(1, cus.max(1));
        let xcc_first: Vec<u32> = (0..=xccs)
            .map(|x| (u64::from(x) * u64::from(cus) / u64::from(xccs)) as u32)
            .collect();
        let cu_xcc = (0..cus)
            .map(|cu| xcc_first.partition_point(|&f| f <= cu) as u32 - 1)
            .collect();
        let xcc_free = xcc_first
            .windows(2)
            .map(|w| u64::from(w[1] - w[0]) * u64::from(waves_per_cu))
            .collect();
        Self {
            free_waves: vec![waves_per_cu; cus as usize],
            waves_per_cu,
            free_total: u64::from(cus) * u64::from(waves_per_cu),
            cursors: xcc_first[..xccs as usize].to_vec(),
            xcc_first,
            cu_xcc,
            xcc_free,
            slots: Vec::new(),
            free_slots: Vec::new(),
            groups: groups.max(1),
            busy_since: vec![0; cus as usize],
            busy_ns: 0,
        }
    }

    pub fn cus(&self) -> u32 {
        self.free_waves.len() as u32
    }

    pub fn waves_per_cu(&self) -> u32 {
        self.waves_per_cu
    }

    pub fn free_total(&self) -> u64 {
        self.free_total
    }

    /// CU time with waves resident, up to `now` (CUs busy at `now` count up to it).
    pub fn busy_ns(&self, now: Nanos) -> u128 {
        let open: u128 = self
            .free_waves
            .iter()
            .zip(&self.busy_since)
            .filter(|(free, _)| **free < self.waves_per_cu)
            .map(|(_, since)| u128::from(now.saturating_sub(*since)))
            .sum();
        self.busy_ns + open
    }

    pub fn group_of(&self, cu: u32) -> u32 {
        (u64::from(cu) * u64::from(self.groups) / u64::from(self.cus())) as u32
    }

    pub fn xccs(&self) -> u32 {
        self.xcc_free.len() as u32
    }

    /// The XCCs with at least one CU in `mask` (all of them without a mask).
    pub fn xccs_of(&self, mask: Option<&CuMask>) -> Vec<u32> {
        (0..self.xccs())
            .filter(|&x| {
                let (a, b) = (self.xcc_first[x as usize], self.xcc_first[x as usize + 1]);
                mask.is_none_or(|m| (a..b).any(|cu| m.contains(cu)))
            })
            .collect()
    }

    /// A CU anywhere in `mask` with room for `waves` (a one-XCC part's placement).
    pub fn find_cu(&mut self, waves: u32, mask: Option<&CuMask>) -> Option<u32> {
        (0..self.xccs()).find_map(|x| self.find_cu_in(x, waves, mask))
    }

    /// A CU of XCC `xcc` in `mask` with room for `waves`, searched round-robin so that work
    /// spreads.
    pub fn find_cu_in(&mut self, xcc: u32, waves: u32, mask: Option<&CuMask>) -> Option<u32> {
        let x = xcc as usize;
        if self.xcc_free.get(x).is_none_or(|&f| f < u64::from(waves)) {
            return None;
        }
        let (first, n) = (self.xcc_first[x], self.xcc_first[x + 1] - self.xcc_first[x]);
        let start = self.cursors[x] - first;
        for i in 0..n {
            let cu = first + (start + i) % n;
            if self.free_waves[cu as usize] >= waves && mask.is_none_or(|m| m.contains(cu)) {
                self.cursors[x] = first + (cu - first + 1) % n;
                return Some(cu);
            }
        }
        None
    }

    /// Occupies wave slots and returns the slot index of the new workgroup.
    pub fn start(&mut self, wg: RunningWg) -> u32 {
        if self.free_waves[wg.cu as usize] == self.waves_per_cu {
            self.busy_since[wg.cu as usize] = wg.start;
        }
        self.free_waves[wg.cu as usize] -= wg.waves;
        self.free_total -= u64::from(wg.waves);
        self.xcc_free[self.cu_xcc[wg.cu as usize] as usize] -= u64::from(wg.waves);
        match self.free_slots.pop() {
            Some(i) => {
                let generation = self.slots[i as usize].generation.wrapping_add(1);
                self.slots[i as usize] = RunningWg {
                    generation,
                    live: true,
                    ..wg
                };
                i
            }
            None => {
                self.slots.push(RunningWg { live: true, ..wg });
                (self.slots.len() - 1) as u32
            }
        }
    }

    pub fn get(&self, slot: u32) -> Option<&RunningWg> {
        self.slots.get(slot as usize)
    }

    /// Ends a running workgroup (finished or stopped). Its wave slots are returned now when
    /// `release` is set; otherwise the caller releases them later (after a state save).
    pub fn end(&mut self, slot: u32, release: bool, now: Nanos) -> Option<RunningWg> {
        let wg = self.slots.get_mut(slot as usize)?;
        if !wg.live {
            return None;
        }
        wg.live = false;
        let wg = *wg;
        self.free_slots.push(slot);
        if release {
            self.release(wg.cu, wg.waves, now);
        }
        Some(wg)
    }

    pub fn release(&mut self, cu: u32, waves: u32, now: Nanos) {
        if let Some(f) = self.free_waves.get_mut(cu as usize) {
            let was_busy = *f < self.waves_per_cu;
            *f = f.saturating_add(waves).min(self.waves_per_cu);
            self.free_total += u64::from(waves);
            self.xcc_free[self.cu_xcc[cu as usize] as usize] += u64::from(waves);
            if was_busy && *f == self.waves_per_cu {
                let since = self.busy_since[cu as usize];
                self.busy_ns += u128::from(now.saturating_sub(since));
            }
        }
    }

    /// Slot indices of the live workgroups of one queue, in slot order.
    pub fn live_of(&self, queue: u32) -> Vec<u32> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, w)| w.live && w.queue == queue)
            .map(|(i, _)| i as u32)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wg(cu: u32, waves: u32) -> RunningWg {
        RunningWg {
            queue: 0,
            dispatch: 0,
            wg: 0,
            cu,
            waves,
            start: 0,
            end: 1,
            generation: 0,
            live: false,
        }
    }

    #[test]
    fn a_mask_from_words_keeps_only_the_devices_cus() {
        let m = CuMask::from_words(vec![u64::MAX, u64::MAX, 1], 70);
        assert_eq!((m.words().len(), m.count()), (2, 70));
        assert!(m.contains(69) && !m.contains(70));
        assert_eq!(
            CuMask::from_words(vec![0b110], 4),
            CuMask::from_range(1, 2, 4)
        );
    }

    #[test]
    fn placement_respects_slots_and_masks() {
        let mut c = Compute::new(4, 8, 2, 1);
        let mask = CuMask::from_range(2, 2, 4);
        assert_eq!(mask.count(), 2);
        let a = c.find_cu(8, Some(&mask)).unwrap();
        assert!(a >= 2);
        c.start(wg(a, 8));
        let b = c.find_cu(8, Some(&mask)).unwrap();
        assert_ne!(a, b);
        let s = c.start(wg(b, 8));
        assert_eq!(c.find_cu(1, Some(&mask)), None);
        assert!(c.find_cu(8, None).is_some());
        let ended = c.end(s, true, 1).unwrap();
        assert_eq!(ended.cu, b);
        assert!(c.end(s, true, 1).is_none(), "a workgroup ends once");
        assert_eq!(c.find_cu(8, Some(&mask)), Some(b));
        assert_eq!((c.group_of(0), c.group_of(3)), (0, 1));
    }

    #[test]
    fn busy_time_counts_each_cu_once_while_any_wave_is_resident() {
        let mut c = Compute::new(2, 8, 1, 1);
        let at = |cu, waves, start| RunningWg {
            start,
            ..wg(cu, waves)
        };
        let a = c.start(at(0, 4, 10));
        let b = c.start(at(0, 4, 20));
        assert_eq!(c.busy_ns(30), 20, "two workgroups on one CU: one CU busy");
        c.end(a, true, 40);
        c.end(b, true, 50);
        // Waves stopped for a save stay resident until they are released.
        let s = c.start(at(1, 2, 50));
        c.end(s, false, 60);
        assert_eq!(c.busy_ns(70), 40 + 20);
        c.release(1, 2, 80);
        assert_eq!(c.busy_ns(1_000), 40 + 30);
    }

    #[test]
    fn each_xcc_places_only_on_its_own_cus() {
        let mut c = Compute::new(10, 8, 1, 4);
        assert_eq!(c.xccs(), 4);
        // 10 CUs over 4 XCCs: 2, 3, 2, 3.
        let per: Vec<u32> = (0..4)
            .map(|x| {
                let mut n = 0;
                while let Some(cu) = c.find_cu_in(x, 8, None) {
                    c.start(wg(cu, 8));
                    n += 1;
                }
                n
            })
            .collect();
        assert_eq!(per, vec![2, 3, 2, 3]);
        assert_eq!(c.free_total(), 0);
        assert_eq!(c.xccs_of(Some(&CuMask::from_range(0, 3, 10))), vec![0, 1]);
    }
}
