//! Text that people read (names, descriptions, notes, table cells): which characters
//! must never reach a screen as they are.

/// Whether `s` starts with `prefix` in any ASCII case: what a reserved prefix is
/// checked by, so `Entrega-` is no way around `entrega-`.
pub fn starts_with_any_case(s: &str, prefix: &str) -> bool {
    s.get(..prefix.len())
        .is_some_and(|start| start.eq_ignore_ascii_case(prefix))
}

/// An error's message followed by its causes' (": connection refused"): clients'
/// own messages often stop at "error sending request" or "db error".
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text += &format!(": {c}");
        cause = c.source();
    }
    text
}

/// Zero-width non-joiner and joiner: invisible, but how Persian, the Indic scripts and
/// emoji sequences write some words and pictures.
const JOINERS: [char; 2] = ['\u{200C}', '\u{200D}'];

/// A control character (a terminal would obey an escape sequence), an invisible or
/// direction-changing format character (it makes one name look like another), a line
/// or paragraph separator (a line break in disguise), or a noncharacter.
pub fn is_hidden_or_control(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{00AD}'                // soft hyphen: shown only where a line breaks
            | '\u{180E}'              // Mongolian vowel separator, zero-width
            | '\u{200B}'..='\u{200F}' // zero-width spaces, joiners and marks
            | '\u{2028}'..='\u{2029}' // line and paragraph separators
            | '\u{202A}'..='\u{202E}' // bidirectional embeddings and overrides
            | '\u{2060}'..='\u{2069}' // word joiner, invisible operators, isolates
            | '\u{FEFF}'              // zero-width no-break space
            | '\u{FDD0}'..='\u{FDEF}') // noncharacters
        || (c as u32) & 0xFFFE == 0xFFFE // the last two code points of every plane
}

/// Whether `chars[i]` must not reach a screen as it is: [`is_hidden_or_control`], but
/// for a joiner between two visible characters outside ASCII, where it is part of
/// the text (a tenant named in Persian, an emoji family, was refused). Between ASCII
/// letters, doubled, or at either end, a joiner only hides.
pub fn is_hidden_at(chars: &[char], i: usize) -> bool {
    let c = chars[i];
    if !JOINERS.contains(&c) {
        return is_hidden_or_control(c);
    }
    let joins = |n: Option<&char>| n.is_some_and(|&n| !n.is_ascii() && !is_hidden_or_control(n));
    !(i > 0 && joins(chars.get(i - 1)) && joins(chars.get(i + 1)))
}

/// Whether `s` is text a person can read as stored: no character
/// [`is_hidden_at`] its place but those in `allowed` (line breaks, in a note).
pub fn is_plain(s: &str, allowed: &[char]) -> bool {
    let chars: Vec<char> = s.chars().collect();
    (0..chars.len()).all(|i| allowed.contains(&chars[i]) || !is_hidden_at(&chars, i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joiners_inside_words_and_pictures_are_text() {
        for fine in [
            "Acme CRM — Zürich ✓",
            "می\u{200C}خواهم",               // Persian, with a non-joiner
            "क्\u{200D}ष",                    // Devanagari, with a joiner
            "👨\u{200D}👩\u{200D}👧 Family", // an emoji family
            "🏳\u{FE0F}\u{200D}🌈",           // a flag
        ] {
            assert!(is_plain(fine, &[]), "{fine:?}");
        }
    }

    #[test]
    fn what_hides_or_commands_is_refused() {
        for bad in [
            "pay\u{200D}pal",       // a joiner between ASCII letters
            "\u{200D}👩",           // at the start
            "👩\u{200D}",           // at the end
            "👨\u{200D}\u{200D}👩", // doubled
            "a\u{200B}b",
            "a\u{202E}b",
            "a\u{00AD}b",
            "a\u{2028}b",
            "a\u{FFFF}b",
            "a\u{FDD0}b",
            "a\u{10FFFE}b",
            "a\u{1}b",
            "a\nb",
            "\u{1b}[31mred",
        ] {
            assert!(!is_plain(bad, &[]), "{bad:?}");
        }
    }

    #[test]
    fn only_the_allowed_pass_beside_the_rule() {
        assert!(is_plain("fixed:\n\tthe DNS", &['\n', '\r', '\t']));
        assert!(!is_plain("fixed:\n\u{2028}the DNS", &['\n', '\r', '\t']));
    }
}
