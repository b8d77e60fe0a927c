//! Text that people read (names, descriptions, table cells): which characters must
//! never reach a screen as they are.

/// A control character (a terminal would obey an escape sequence) or an invisible or
/// direction-changing format character (it makes one name look like another).
pub fn is_hidden_or_control(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{200B}'..='\u{200F}'   // zero-width spaces and marks
            | '\u{202A}'..='\u{202E}' // bidirectional embeddings and overrides
            | '\u{2060}'..='\u{2069}' // word joiner, invisible operators, isolates
            | '\u{FEFF}') // zero-width no-break space
}
