//! A numeric x axis: linear with 1-2-5 steps, or logarithmic by decades when the values span
//! ten times or more (a tail of a few slow requests would flatten a linear plot).

/// Maps values onto `left..right` pixels.
pub(crate) struct Axis {
    pub log: bool,
    pub lo: f64,
    pub hi: f64,
    pub left: f64,
    pub right: f64,
    /// Linear: the step the range was rounded to, which the ticks use.
    step: f64,
}

/// A 1, 2 or 5 times a power of ten step that cuts `span` into about `parts`.
fn nice_step(span: f64, parts: f64) -> f64 {
    let raw = (span / parts).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let n = if f < 1.5 {
        1.0
    } else if f < 3.0 {
        2.0
    } else if f < 7.0 {
        5.0
    } else {
        10.0
    };
    n * mag
}

impl Axis {
    /// An axis that holds `lo..=hi` (no finite values: 0..1).
    pub fn fit(lo: f64, hi: f64, left: f64, right: f64) -> Self {
        let (lo, hi) = if lo.is_finite() && hi.is_finite() && lo <= hi {
            (lo, hi)
        } else {
            (0.0, 1.0)
        };
        if lo > 0.0 && hi / lo >= 10.0 {
            return Self {
                log: true,
                lo: 10f64.powf(lo.log10().floor()),
                hi: 10f64.powf(hi.log10().ceil()),
                left,
                right,
                step: 0.0,
            };
        }
        // Linear: a little room either side so that a step at the edge stays visible.
        let pad = ((hi - lo) * 0.05).max(hi.abs() * 0.02).max(1e-3);
        let step = nice_step(hi - lo + 2.0 * pad, 6.0);
        let lo = (((lo - pad) / step).floor() * step).max(0.0);
        let hi = ((hi + pad) / step).ceil() * step;
        Self {
            log: false,
            lo,
            hi,
            left,
            right,
            step,
        }
    }

    pub fn px(&self, v: f64) -> f64 {
        let f = if self.log {
            (v.max(self.lo).log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        };
        self.left + f.clamp(0.0, 1.0) * (self.right - self.left)
    }

    /// Grid positions: (value, labelled). Log axes label each decade and grid 2× and 5×.
    pub fn ticks(&self) -> Vec<(f64, bool)> {
        let mut out = Vec::new();
        if self.log {
            let mut decade = self.lo;
            while decade <= self.hi * 1.000_001 {
                out.push((decade, true));
                for m in [2.0, 5.0] {
                    if decade * m < self.hi {
                        out.push((decade * m, false));
                    }
                }
                decade *= 10.0;
            }
        } else {
            // Wide ranges would crowd the labels: every other step.
            let n = ((self.hi - self.lo) / self.step).round();
            let step = if n > 10.0 { self.step * 2.0 } else { self.step };
            let mut i = (self.lo / step).ceil();
            while i * step <= self.hi + step * 1e-9 {
                out.push((i * step, true));
                i += 1.0;
            }
        }
        out
    }
}

/// A tick or legend number: no trailing zeros, three significant digits below 100.
pub(crate) fn fmt_num(v: f64) -> String {
    if v >= 100.0 || v == 0.0 {
        return format!("{v:.0}");
    }
    let decimals = (2 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_and_log_axes_hold_their_values() {
        let a = Axis::fit(20.9, 52.15, 0.0, 100.0);
        assert!(!a.log && a.lo <= 20.9 && a.hi >= 52.15, "{} {}", a.lo, a.hi);
        assert_eq!(a.px(a.lo), 0.0);
        assert_eq!(a.px(a.hi), 100.0);
        let t: Vec<f64> = a.ticks().iter().map(|t| t.0).collect();
        assert_eq!(t, [15.0, 20.0, 25.0, 30.0, 35.0, 40.0, 45.0, 50.0, 55.0]);
        // The last tick is the end of the axis.
        let m = Axis::fit(0.0, 77.2, 0.0, 100.0);
        let t: Vec<f64> = m.ticks().iter().map(|t| t.0).collect();
        assert_eq!(t.last(), Some(&m.hi), "{t:?}");
        let l = Axis::fit(0.3, 45.0, 0.0, 300.0);
        assert!(l.log && l.lo == 0.1 && l.hi == 100.0);
        assert!((l.px(1.0) - 100.0).abs() < 1e-9 && (l.px(10.0) - 200.0).abs() < 1e-9);
        assert_eq!(l.ticks().iter().filter(|t| t.1).count(), 4);
        let none = Axis::fit(f64::INFINITY, 0.0, 0.0, 10.0);
        assert!(!none.log && none.px(0.5) > 0.0);
    }

    #[test]
    fn numbers_read_short() {
        assert_eq!(fmt_num(20.904), "20.9");
        assert_eq!(fmt_num(5.0), "5");
        assert_eq!(fmt_num(0.25), "0.25");
        assert_eq!(fmt_num(1234.6), "1235");
        assert_eq!(fmt_num(0.0), "0");
    }
}
