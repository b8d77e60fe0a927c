//! What an event's payload, forwarded as written, may hold that a JSON parser does not
//! refuse: the API's parse skips over `data` without decoding it, and a producer's
//! outbox row is JSON already, so their strings' escapes and their nesting are
//! checked here, by the same rules for both.

/// Deepest nesting of arrays and objects a raw field may have: what parsing the body
/// as a value allowed before (serde_json's limit of 128, less the body's own object
/// and one), so nothing taken before is refused now. Receivers' parsers have such
/// limits too (serde_json's default is 128): deeper, the webhook would fail at every
/// attempt.
pub const MAX_RAW_NESTING: usize = 126;

/// Why a raw field is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawJsonProblem {
    /// A `\u` escape of half a surrogate pair without the other half right after it.
    LoneSurrogate,
    /// Arrays and objects nested deeper than [`MAX_RAW_NESTING`].
    TooDeep,
}

impl RawJsonProblem {
    pub fn describe(self) -> String {
        match self {
            Self::LoneSurrogate => "holds a lone surrogate escape (`\\ud800` to `\\udfff` without \
                 its pair): valid JSON, but not text a receiver can decode"
                .to_owned(),
            Self::TooDeep => format!(
                "nests arrays and objects deeper than {MAX_RAW_NESTING} levels, past what \
                 receivers' JSON parsers take"
            ),
        }
    }
}

/// The first problem of JSON text `bytes` (already known to be JSON), if any.
pub fn raw_json_problem(bytes: &[u8]) -> Option<RawJsonProblem> {
    let code_unit = |at: usize| {
        bytes
            .get(at..at + 4)
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u16::from_str_radix(hex, 16).ok())
    };
    let (mut depth, mut in_string, mut high_pending) = (0usize, false, false);
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        if !in_string {
            match byte {
                b'"' => in_string = true,
                b'[' | b'{' => {
                    depth += 1;
                    if depth > MAX_RAW_NESTING {
                        return Some(RawJsonProblem::TooDeep);
                    }
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
            i += 1;
            continue;
        }
        if byte != b'\\' {
            if high_pending {
                return Some(RawJsonProblem::LoneSurrogate);
            }
            in_string = byte != b'"';
            i += 1;
            continue;
        }
        let unit = (bytes.get(i + 1) == Some(&b'u'))
            .then(|| code_unit(i + 2))
            .flatten();
        match unit {
            Some(0xD800..=0xDBFF) if !high_pending => high_pending = true,
            Some(0xDC00..=0xDFFF) if high_pending => high_pending = false,
            Some(0xD800..=0xDFFF) => return Some(RawJsonProblem::LoneSurrogate),
            _ if high_pending => return Some(RawJsonProblem::LoneSurrogate),
            _ => {}
        }
        i += if unit.is_some() { 6 } else { 2 };
    }
    high_pending.then_some(RawJsonProblem::LoneSurrogate)
}

/// Whether serde_json refused a string it decodes for holding half a surrogate pair
/// (it names it two ways, by where the pair broke; "invalid unicode code point" is
/// bytes that are not UTF-8, another fault).
pub fn is_lone_surrogate_error(e: &serde_json::Error) -> bool {
    let message = e.to_string();
    e.is_syntax()
        && ["lone leading surrogate", "end of hex escape"]
            .iter()
            .any(|m| message.contains(m))
}

#[cfg(test)]
mod tests {
    use super::{raw_json_problem, RawJsonProblem, MAX_RAW_NESTING};

    #[test]
    fn a_lone_surrogate_escape_is_found_and_a_pair_is_not() {
        for lone in [
            r#""\ud800""#,
            r#""\uDC00""#,
            r#""a\ud83dz""#,
            r#""\ud83d\n""#,
            r#""\ud83d\ud83d""#,
            r#"["\ud83d","\ude00"]"#,
        ] {
            assert_eq!(
                raw_json_problem(lone.as_bytes()),
                Some(RawJsonProblem::LoneSurrogate),
                "{lone}"
            );
        }
        for fine in [
            r#""\ud83d\ude00""#,
            r#""\\ud800""#,
            r#""\u00e9 \"\\\/ \n""#,
            r#"{"a":[1,2,{"b":"\uD83D\uDE00"}]}"#,
            "\"😀 ü\"",
        ] {
            assert_eq!(raw_json_problem(fine.as_bytes()), None, "{fine}");
        }
    }

    #[test]
    fn nesting_counts_brackets_outside_strings_only() {
        let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert_eq!(raw_json_problem(nested(MAX_RAW_NESTING).as_bytes()), None);
        assert_eq!(
            raw_json_problem(nested(MAX_RAW_NESTING + 1).as_bytes()),
            Some(RawJsonProblem::TooDeep)
        );
        let brackets_in_a_string = format!(r#"{{"a":"{}\"{}"}}"#, "[".repeat(500), "{".repeat(500));
        assert_eq!(raw_json_problem(brackets_in_a_string.as_bytes()), None);
        // Side by side is not deeper.
        let wide = format!("[{}]", vec![nested(100); 50].join(","));
        assert_eq!(raw_json_problem(wide.as_bytes()), None);
    }
}
