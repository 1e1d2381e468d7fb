//! Names that clients supply (a process's name in its Hello) reach terminals (`xpreempt list`,
//! `top`), logs and metrics labels. [`clean`] makes one safe to show: control characters
//! (escape sequences, newlines, carriage returns, C1 controls) and invisible reordering marks
//! are written as escapes, and the length is capped.

/// The most characters of a client's name that are kept.
pub const MAX_NAME: usize = 64;

/// `name` with every character that could move the cursor, recolour or rewrite a terminal, or
/// start a new log line, escaped (`\n`, `\x1b`, `\u{202e}`), cut to [`MAX_NAME`] characters
/// shown (an ellipsis marks the cut). Printable text, other scripts included, is kept as it is.
pub fn clean(name: &str) -> String {
    let mut out = String::new();
    let mut shown = 0;
    for c in name.chars() {
        let piece = match c {
            '\n' => "\\n".to_string(),
            '\r' => "\\r".to_string(),
            '\t' => "\\t".to_string(),
            '\\' => "\\\\".to_string(),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => format!("\\x{:02x}", c as u32),
            c if invisible(c) => format!("\\u{{{:x}}}", c as u32),
            c => c.to_string(),
        };
        let n = piece.chars().count();
        if shown + n > MAX_NAME {
            out.push('…');
            break;
        }
        shown += n;
        out.push_str(&piece);
    }
    out
}

/// C1 controls, bidirectional overrides and isolates, and zero-width or line-separating marks.
fn invisible(c: char) -> bool {
    matches!(c as u32,
        0x80..=0x9f | 0x200b..=0x200f | 0x2028..=0x202e | 0x2060..=0x2069 | 0xfeff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_and_newlines_are_escaped() {
        let forged = "ok\x1b[31mRED\x1b[0m\n    9 666 fake";
        let c = clean(forged);
        assert!(!c.chars().any(|c| c.is_control()), "{c:?}");
        assert_eq!(c, "ok\\x1b[31mRED\\x1b[0m\\n    9 666 fake");
        assert_eq!(clean("a\rb\u{202e}c\u{9b}d"), "a\\rb\\u{202e}c\\u{9b}d");
    }

    #[test]
    fn plain_names_are_kept_and_long_ones_cut() {
        assert_eq!(clean("python3"), "python3");
        assert_eq!(clean("训练-job"), "训练-job");
        let long = "x".repeat(10_000);
        assert_eq!(clean(&long).chars().count(), MAX_NAME + 1);
        assert!(clean(&long).ends_with('…'));
    }
}
