//! Request extractors whose failures are problem+json naming the field at fault:
//! axum's own rejections are plain text and often do not say which field.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::problem::ApiError;
use entrega_core::raw_json;

/// Largest request body: the event payload limit plus room for the envelope.
pub const MAX_BODY_BYTES: usize = entrega_core::event::MAX_PAYLOAD_BYTES + 4 * 1024;

/// A JSON body, parsed with the path of any bad field reported.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        parse_json(&read_body(req).await?).map(JsonBody)
    }
}

/// The body of a route that takes none: nothing, or `{}` (what the CLI sends). Any
/// field is a 422 naming it, anything else a 400. Why not ignore it: `{"secret": …}`
/// to `rotate-secret` set no secret of the caller's choosing, yet answered 200.
pub struct NoBody;

/// What [`NoBody`] accepts when a body is sent: an object with no fields.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NoFields {}

impl<S: Send + Sync> FromRequest<S> for NoBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        let bytes = read_body(req).await?;
        if !bytes.iter().all(u8::is_ascii_whitespace) {
            parse_json::<NoFields>(&bytes)?;
        }
        Ok(NoBody)
    }
}

/// The whole request body, within [`MAX_BODY_BYTES`] and the server's deadline. An
/// encoded body is a 415: read as it came, a gzipped one was "not valid JSON", and a
/// plain one labelled gzip was taken.
async fn read_body(req: Request) -> Result<Bytes, ApiError> {
    let encodings = req.headers().get_all(axum::http::header::CONTENT_ENCODING);
    if encodings.iter().any(|e| {
        e.to_str()
            .map_or(true, |e| !e.trim().eq_ignore_ascii_case("identity"))
    }) {
        return Err(ApiError::from_status(
            axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "the body is encoded (`Content-Encoding`): send it as plain JSON",
        ));
    }
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    // A body declared too large is refused before a byte of it is waited for.
    if declared.is_some_and(|len| len > MAX_BODY_BYTES) {
        return Err(ApiError::too_large(MAX_BODY_BYTES));
    }
    collect_body(req.into_body(), declared.unwrap_or(0)).await
}

/// The body's bytes, copied out of each frame as it arrives. Why copy: a frame is a
/// slice of the connection's read buffer and keeps the whole buffer alive, so a body
/// kept as its frames, sent a byte at a time, held about 8 KiB of the server's memory
/// for each byte the client sent (2 GiB for one 256 KiB body, a hostile test).
async fn collect_body(body: axum::body::Body, declared: usize) -> Result<Bytes, ApiError> {
    use futures_util::StreamExt;
    let mut frames = body.into_data_stream();
    let mut whole = Vec::with_capacity(declared.min(MAX_BODY_BYTES));
    while let Some(frame) = frames.next().await {
        let frame = frame.map_err(|e| {
            if caused_by::<BodyTooSlow>(&e) {
                ApiError::body_timeout()
            } else {
                ApiError::bad_request(
                    "the request body could not be read (broken chunked encoding, or the \
                     connection ended early)",
                )
            }
        })?;
        if whole.len() + frame.len() > MAX_BODY_BYTES {
            return Err(ApiError::too_large(MAX_BODY_BYTES));
        }
        whole.extend_from_slice(&frame);
    }
    Ok(Bytes::from(whole))
}

/// What a server's request body gives when the body did not arrive whole in time
/// (the embedded server's deadline for the whole body); the extractors answer 408.
#[derive(Debug)]
pub struct BodyTooSlow;

impl std::fmt::Display for BodyTooSlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body did not arrive in time")
    }
}

impl std::error::Error for BodyTooSlow {}

/// Whether `E` is anywhere in `error`'s chain of sources.
fn caused_by<E: std::error::Error + 'static>(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.is::<E>() {
            return true;
        }
        cause = e.source();
    }
    false
}

/// Parse `bytes` as `T`, naming what is wrong when it cannot be: no body, or text
/// that is not one JSON object (or has data after it), is a 400; valid JSON the route
/// cannot take is a 422 naming the field (`"mode": null` included).
///
/// A body that fits is read once, straight into `T`. Only a refused one is read again,
/// as a JSON value, to tell a malformed body (400) from a field the route cannot take
/// (422): reading every body as a value first cost a second parse of each published
/// event, and refused what a field kept as its text takes as written (a `data` of
/// `1e400`, valid JSON past what an `f64` holds).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "this route takes a JSON object body (`{}` when every field is left out)",
        ));
    }
    // A field given twice is refused here too (a value would keep the last).
    let mut text = serde_json::Deserializer::from_slice(bytes);
    let refused = match serde_path_to_error::deserialize(&mut text) {
        // A struct also reads from an array of its fields in order: `["a", {}]`
        // published an event of type `a`. Only an object is taken.
        Ok(parsed) if text.end().is_ok() && starts_as_object(bytes) => {
            // Below the top level, a field given twice passes the parse: a field kept
            // as written (`data`) keeps both, and a map keeps the last.
            return match entrega_core::json_keys::duplicate_key(bytes) {
                Some(path) => Err(ApiError::bad_parameter(&path, "given twice; give it once")),
                None => Ok(parsed),
            };
        }
        Ok(_) => None,
        Err(e) => Some(e),
    };
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        // The field whose text this error is in: where the parse into `T` stopped too.
        let at_field = refused
            .as_ref()
            .filter(|r| (r.inner().line(), r.inner().column()) == (e.line(), e.column()))
            .map(|r| r.path().to_string());
        match at_field {
            // Valid JSON text, but not text: name the field that holds it.
            Some(path) if path != "." && raw_json::is_lone_surrogate_error(&e) => {
                ApiError::invalid(&path, raw_json::RawJsonProblem::LoneSurrogate.describe())
            }
            _ if e.is_eof() || e.is_syntax() => ApiError::bad_request(format!(
                "the body is not one valid JSON value (nothing may follow it): {e}"
            )),
            _ => ApiError::bad_request(format!("the body is not valid JSON: {e}")),
        }
    })?;
    if !value.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    let Some(e) = refused else {
        // Only data after the object is left, which the value's parse refused.
        return Err(ApiError::bad_request(
            "the body is not one valid JSON value (nothing may follow it)",
        ));
    };
    let path = e.path().to_string();
    let inner = e.into_inner();
    let message = inner.to_string();
    // A field serde names, under the path of the object that holds it.
    let at_path = |field: String| {
        if path == "." {
            field
        } else {
            format!("{path}.{field}")
        }
    };
    Err(
        if let Some(field) = field_named(&message, "missing field") {
            ApiError::invalid(&at_path(field), "is required")
        } else if let Some(field) = field_named(&message, "duplicate field") {
            // Valid JSON text, but which of the two did the client mean? A 400, as a
            // parameter given twice is, naming it.
            ApiError::bad_parameter(&at_path(field), "given twice; give it once")
        } else if path == "." {
            match field_named(&message, "unknown field") {
                Some(field) => ApiError::invalid(&field, "is not a field of this route"),
                None => ApiError::bad_request(format!("the body does not fit this route: {inner}")),
            }
        } else {
            ApiError::invalid(&path, inner)
        },
    )
}

/// Whether the JSON text is an object: its first byte past whitespace opens one.
fn starts_as_object(bytes: &[u8]) -> bool {
    bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// The field a serde error of `kind` names: serde writes "missing field `name`",
/// "duplicate field `name`", "unknown field `name`, expected …".
fn field_named(message: &str, kind: &str) -> Option<String> {
    let rest = message.strip_prefix(kind)?.strip_prefix(" `")?;
    Some(rest.split('`').next()?.to_owned())
}

/// Query parameters as a map; each route reads and validates the ones it knows (the
/// others, and any given twice, were refused before: see `query_params`).
pub struct QueryMap(pub std::collections::HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for QueryMap {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or("");
        let pairs = url::form_urlencoded::parse(query.as_bytes()).into_owned();
        Ok(QueryMap(pairs.collect()))
    }
}

impl QueryMap {
    /// Parse parameter `name` if present, naming it in the error otherwise.
    pub fn parse<T: std::str::FromStr>(
        &self,
        name: &str,
        what: &str,
    ) -> Result<Option<T>, ApiError> {
        match self.0.get(name) {
            None => Ok(None),
            Some(raw) => raw
                .parse()
                .map(Some)
                .map_err(|_| ApiError::invalid(name, format!("expected {what}"))),
        }
    }
}

/// Text shown to people (names, descriptions): nothing a screen would hide or obey.
pub(crate) fn is_plain_text(s: &str) -> bool {
    entrega_core::text::is_plain(s, &[])
}

#[cfg(test)]
mod plain_text_tests {
    use super::is_plain_text;

    #[test]
    fn control_and_invisible_characters_are_not_plain_text() {
        assert!(is_plain_text("Acme CRM — Zürich ✓"));
        assert!(is_plain_text("می\u{200C}خواهم"));
        for bad in [
            "a\u{1}b",
            "a\nb",
            "\u{1b}[31mred",
            "a\u{202E}b",
            "a\u{200B}b",
            "a\u{0}b",
        ] {
            assert!(!is_plain_text(bad), "{bad:?}");
        }
    }
}

#[cfg(test)]
mod json_body_tests {
    use super::parse_json;
    use axum::http::StatusCode;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        name: String,
        data: Box<serde_json::value::RawValue>,
    }

    fn refused(text: &str) -> (StatusCode, Option<String>, String) {
        let e = parse_json::<Body>(text.as_bytes()).expect_err(text);
        (e.status, e.field.clone(), e.detail.clone())
    }

    #[test]
    fn a_body_that_fits_is_taken_with_its_raw_field_as_written() {
        let body: Body =
            parse_json(br#"{"name":"a","data":{"n":1e400,"b":12345678901234567890123}}"#).unwrap();
        assert_eq!(body.name, "a");
        assert_eq!(
            body.data.get(),
            r#"{"n":1e400,"b":12345678901234567890123}"#
        );
    }

    #[test]
    fn bytes_that_are_not_utf8_are_a_malformed_body() {
        let e = parse_json::<Body>(b"{\"name\":\"\xff\",\"data\":1}").expect_err("not UTF-8");
        assert_eq!(
            (e.status, e.field),
            (StatusCode::BAD_REQUEST, None),
            "{}",
            e.detail
        );
    }

    #[test]
    fn each_refusal_says_whose_fault_it_is() {
        for malformed in [
            "",
            " \n",
            "{",
            r#"{"name":"a","data":1} x"#,
            r#"{"name":"a","data":1}{}"#,
            "[1]",
            // Its fields in order: a struct reads from that too.
            r#"["a",1]"#,
            " \n[\"a\",{}]",
            "7",
            r#"{"name":"a","data":[1,]}"#,
            // Not `name`'s fault: the first error is `data`'s.
            r#"{"data":"\ud800","name":[1,]}"#,
        ] {
            let (status, field, detail) = refused(malformed);
            assert_eq!(status, StatusCode::BAD_REQUEST, "{malformed:?}: {detail}");
            assert_eq!(field, None, "{malformed:?}");
        }
        // Not the last one kept, as a value would: a 400 naming it.
        let (status, field, detail) = refused(r#"{"name":"a","name":"b","data":1}"#);
        assert_eq!(
            (status, field.as_deref()),
            (StatusCode::BAD_REQUEST, Some("name")),
            "{detail}"
        );
        for (unfit, named) in [
            (r#"{"data":1}"#, "name"),
            (r#"{"name":1,"data":1}"#, "name"),
            (r#"{"name":"a","data":1,"extra":2}"#, "extra"),
            (r#"{"name":"\ud800","data":1}"#, "name"),
            (r#"{"name":"a\ud83d\n","data":1}"#, "name"),
            (r#"{"name":"\udc00","data":1}"#, "name"),
        ] {
            let (status, field, detail) = refused(unfit);
            assert_eq!(
                status,
                StatusCode::UNPROCESSABLE_ENTITY,
                "{unfit}: {detail}"
            );
            assert_eq!(field.as_deref(), Some(named), "{unfit}: {detail}");
        }
    }
}

#[cfg(test)]
mod body_tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use axum::body::{Body, Bytes};
    use axum::http::StatusCode;
    use futures_util::{FutureExt, StreamExt};

    use super::{read_body, MAX_BODY_BYTES};

    /// How large a buffer each test frame keeps alive, as a slice of a connection's
    /// read buffer does.
    const BUFFER: usize = 8 * 1024;

    /// A one-byte frame that owns a whole buffer, and counts itself while it lives.
    struct Frame {
        buffer: Vec<u8>,
        live: Arc<AtomicUsize>,
    }

    impl AsRef<[u8]> for Frame {
        fn as_ref(&self) -> &[u8] {
            &self.buffer[..1]
        }
    }

    impl Drop for Frame {
        fn drop(&mut self) {
            self.live.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// A body sent a byte at a time is not kept as its frames: each frame's buffer is
    /// let go once its byte is copied, so what the server holds is the body, not a
    /// buffer per byte.
    #[tokio::test]
    async fn a_body_sent_a_byte_at_a_time_does_not_keep_its_frames() {
        const FRAMES: usize = 2_000;
        let live = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (l, m) = (live.clone(), most.clone());
        let frames = futures_util::stream::iter(0..FRAMES).map(move |n| {
            let now = l.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(now, Ordering::SeqCst);
            let mut buffer = vec![0u8; BUFFER];
            buffer[0] = b'0' + (n % 10) as u8;
            Ok::<_, std::io::Error>(Bytes::from_owner(Frame {
                buffer,
                live: l.clone(),
            }))
        });
        let request = axum::http::Request::new(Body::from_stream(frames));
        let body = read_body(request).await.unwrap();
        let expected: Vec<u8> = (0..FRAMES).map(|n| b'0' + (n % 10) as u8).collect();
        assert_eq!(&body[..], &expected[..]);
        assert_eq!(live.load(Ordering::SeqCst), 0, "every frame let go");
        let held = most.load(Ordering::SeqCst);
        assert!(
            held <= 2,
            "{held} frames of {BUFFER} bytes were held at once"
        );
    }

    /// A body declared larger than the limit is refused at once, without waiting for
    /// any of it (a client that declares 10 MB and sends nothing got a 408 after 30 s).
    #[test]
    fn a_body_declared_too_large_is_refused_before_it_arrives() {
        let never = futures_util::stream::pending::<Result<Bytes, std::io::Error>>();
        let request = axum::http::Request::builder()
            .header("content-length", (MAX_BODY_BYTES + 1).to_string())
            .body(Body::from_stream(never))
            .unwrap();
        let answer = read_body(request)
            .now_or_never()
            .expect("answered without waiting for the body");
        assert_eq!(answer.unwrap_err().status, StatusCode::PAYLOAD_TOO_LARGE);
    }

    /// A body that turns out larger than the limit as it arrives is refused (no
    /// `Content-Length`: chunked).
    #[tokio::test]
    async fn a_body_past_the_limit_is_refused_as_it_arrives() {
        let chunk = Bytes::from(vec![b' '; 64 * 1024]);
        let chunks = futures_util::stream::iter(
            std::iter::repeat_n(chunk, MAX_BODY_BYTES / (64 * 1024) + 1)
                .map(Ok::<_, std::io::Error>),
        );
        let request = axum::http::Request::new(Body::from_stream(chunks));
        let answer = read_body(request).await;
        assert_eq!(answer.unwrap_err().status, StatusCode::PAYLOAD_TOO_LARGE);
    }
}
