//! A minimal horizontal bar chart in SVG (no font or plotting dependency).

/// `rows`: (label, value, annotation). Values are drawn on a log10 axis when `log` is set.
pub fn bar_chart(title: &str, unit: &str, rows: &[(String, f64, String)], log: bool) -> String {
    let w = 900.0;
    let row_h = 22.0;
    let left = 260.0;
    let right = 160.0;
    let top = 40.0;
    let h = top + rows.len() as f64 * row_h + 30.0;
    let tx = |v: f64| if log { v.max(1e-3).log10() } else { v };
    let vmax = rows
        .iter()
        .map(|r| tx(r.1))
        .filter(|v| v.is_finite())
        .fold(f64::MIN, f64::max);
    let vmin = if log {
        rows.iter()
            .map(|r| tx(r.1))
            .filter(|v| v.is_finite())
            .fold(f64::MAX, f64::min)
            .min(0.0)
    } else {
        0.0
    };
    let span = (vmax - vmin).max(1e-9);
    let mut s = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n<text x='10' y='20' font-size='15'>{}</text>\n",
        esc(title)
    );
    for (i, (label, v, note)) in rows.iter().enumerate() {
        let y = top + i as f64 * row_h;
        let len = if v.is_finite() {
            (tx(*v) - vmin) / span * (w - left - right)
        } else {
            0.0
        };
        s += &format!(
            "<text x='{}' y='{}' text-anchor='end'>{}</text><rect x='{left}' y='{}' width='{:.1}' height='{}' fill='#4878a8'/><text x='{:.1}' y='{}'>{:.3} {} {}</text>\n",
            left - 6.0,
            y + 15.0,
            esc(label),
            y + 3.0,
            len.max(1.0),
            row_h - 6.0,
            left + len.max(1.0) + 4.0,
            y + 15.0,
            v,
            esc(unit),
            esc(note)
        );
    }
    s += &format!(
        "<text x='{left}' y='{}' fill='#666'>{}</text>\n</svg>\n",
        h - 8.0,
        if log { "log scale" } else { "linear scale" }
    );
    s
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    #[test]
    fn chart_has_a_bar_per_row() {
        let rows = vec![
            ("a".to_string(), 1.0, String::new()),
            ("b<".to_string(), 100.0, "x".into()),
        ];
        let s = super::bar_chart("t", "us", &rows, true);
        assert_eq!(s.matches("<rect").count(), 3);
        assert!(s.contains("b&lt;"));
    }
}
