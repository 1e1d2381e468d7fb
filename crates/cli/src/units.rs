//! Durations and fractions as people read them in `list` and `top`: three significant digits
//! in the unit that suits (ns, µs, ms, s), a percentage, and `-` for what was not measured.

use xpreempt_types::Nanos;

/// `850µs`, `12.3ms`, `1.20s`; `-` when absent.
pub fn duration(ns: Option<Nanos>) -> String {
    let Some(ns) = ns else {
        return "-".to_string();
    };
    // A value that would round to 1000 of a unit is shown in the next one.
    let (v, unit) = match ns {
        0..1_000 => return format!("{ns}ns"),
        1_000..999_500 => (ns as f64 / 1e3, "µs"),
        999_500..999_500_000 => (ns as f64 / 1e6, "ms"),
        _ => (ns as f64 / 1e9, "s"),
    };
    if v < 9.995 {
        format!("{v:.2}{unit}")
    } else if v < 99.95 {
        format!("{v:.1}{unit}")
    } else {
        format!("{v:.0}{unit}")
    }
}

/// A fraction of time in whole percent (`37%`), `<1%` for a little above nothing.
pub fn percent(fraction: f64) -> String {
    let p = (fraction * 100.0).clamp(0.0, 100.0);
    if p > 0.0 && p < 0.5 {
        "<1%".to_string()
    } else {
        format!("{p:.0}%")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_the_unit_that_suits_them() {
        let cases = [
            (None, "-"),
            (Some(0), "0ns"),
            (Some(999), "999ns"),
            (Some(1_000), "1.00µs"),
            (Some(23_456), "23.5µs"),
            (Some(850_000), "850µs"),
            (Some(999_499), "999µs"),
            (Some(999_999), "1.00ms"),
            (Some(4_800_000), "4.80ms"),
            (Some(77_000_000), "77.0ms"),
            (Some(1_200_000_000), "1.20s"),
            (Some(3_600_000_000_000), "3600s"),
        ];
        for (ns, want) in cases {
            assert_eq!(duration(ns), want, "{ns:?}");
        }
    }

    #[test]
    fn fractions_are_whole_percent_and_a_trace_of_use_is_not_zero() {
        assert_eq!(percent(0.0), "0%");
        assert_eq!(percent(0.001), "<1%");
        assert_eq!(percent(0.374), "37%");
        assert_eq!(percent(1.0), "100%");
        assert_eq!(percent(1.7), "100%");
    }
}
