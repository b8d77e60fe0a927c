//! Keys given twice in one JSON object, at any depth. JSON text may hold them (the
//! RFC only says names *should* be unique), and parsers disagree on which one counts:
//! serde keeps the last, others the first. A body field given twice is refused, at
//! any depth, so a receiver never reads another payload than the one Entrega
//! compared, stored and signed.

use std::borrow::Cow;
use std::collections::HashSet;

/// An array or object the scan is inside.
enum Container<'a> {
    Object {
        seen: HashSet<Cow<'a, str>>,
        /// The key whose value the scan is in.
        current: Option<Cow<'a, str>>,
    },
    Array {
        index: usize,
    },
}

/// The path of the first key given twice in one object of JSON text `bytes`
/// (`data.items[2].id`), or `None`. The text must already be known to be JSON (what a
/// parse accepted): this scans it, it does not check it.
///
/// Why a scan of the bytes and not a walk with serde: a walk decodes every number,
/// and stops at one a field keeps as written but an `f64` cannot hold (`1e400`),
/// missing any key after it.
pub fn duplicate_key(bytes: &[u8]) -> Option<String> {
    let mut stack: Vec<Container<'_>> = Vec::new();
    let mut expect_key = false;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                let end = string_end(bytes, i)?;
                if expect_key {
                    let key = decode_key(&bytes[i..=end])?;
                    if let Some(Container::Object { seen, current }) = stack.last_mut() {
                        if !seen.insert(key.clone()) {
                            return Some(path_to(&stack[..stack.len() - 1], &key));
                        }
                        *current = Some(key);
                    }
                    expect_key = false;
                }
                i = end;
            }
            b'{' => {
                stack.push(Container::Object {
                    seen: HashSet::new(),
                    current: None,
                });
                expect_key = true;
            }
            b'[' => stack.push(Container::Array { index: 0 }),
            b'}' | b']' => {
                stack.pop();
                expect_key = false;
            }
            b',' => match stack.last_mut() {
                Some(Container::Object { .. }) => expect_key = true,
                Some(Container::Array { index }) => *index += 1,
                None => {}
            },
            _ => {}
        }
        i += 1;
    }
    None
}

/// Where the string opened at `start` closes.
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// A key as text, quotes included in `quoted`: decoded, so `"a"` and `"\u0061"` are
/// one key; borrowed when it has no escape.
fn decode_key(quoted: &[u8]) -> Option<Cow<'_, str>> {
    if quoted.contains(&b'\\') {
        serde_json::from_slice::<String>(quoted)
            .ok()
            .map(Cow::Owned)
    } else {
        std::str::from_utf8(&quoted[1..quoted.len() - 1])
            .ok()
            .map(Cow::Borrowed)
    }
}

/// The path of `key` in the object inside `outer`.
fn path_to(outer: &[Container<'_>], key: &str) -> String {
    let mut path = String::new();
    for container in outer {
        match container {
            Container::Object {
                current: Some(k), ..
            } => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
            }
            Container::Object { current: None, .. } => {}
            Container::Array { index } => path.push_str(&format!("[{index}]")),
        }
    }
    if !path.is_empty() {
        path.push('.');
    }
    path.push_str(key);
    path
}

#[cfg(test)]
mod tests {
    use super::duplicate_key;

    #[test]
    fn a_key_given_twice_is_found_at_any_depth_with_its_path() {
        for (text, path) in [
            (r#"{"a":1,"a":2}"#, "a"),
            (
                r#"{"retry":{"delays_s":[1],"delays_s":[2]}}"#,
                "retry.delays_s",
            ),
            (
                r#"{"data":{"x":1,"y":{"z":[{"k":1},{"k":1,"k":2}]}}}"#,
                "data.y.z[1].k",
            ),
            (r#"{"data":{"a":1,"\u0061":2}}"#, "data.a"),
            (r#"[{"a":1},{"b":1,"b":1}]"#, "[1].b"),
            (r#"{"big":1e400,"c":"\"}","c":3}"#, "c"),
        ] {
            assert_eq!(
                duplicate_key(text.as_bytes()).as_deref(),
                Some(path),
                "{text}"
            );
        }
    }

    #[test]
    fn the_same_key_in_different_objects_is_no_duplicate() {
        for text in [
            r#"{"a":{"a":{"a":1}},"b":[{"a":1},{"a":2}]}"#,
            r#"{"a":"{\"a\":1,\"a\":2}"}"#,
            r#"{"A":1,"a":2}"#,
            "[]",
            r#"{"big":1e400,"a":1}"#,
            r#"{"s":"\\","t":"x\"y","u":1}"#,
        ] {
            assert_eq!(duplicate_key(text.as_bytes()), None, "{text}");
        }
    }
}
