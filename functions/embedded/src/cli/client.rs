//! The CLI's API client: one request, and an API problem turned into a clear error.

use serde_json::Value;

/// An API answer that was not a success, or a request that got no answer.
#[derive(Debug)]
pub struct CliError(pub String);

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CliError {}

/// How long the CLI waits to connect to the API.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// The most of an answer's body an error message quotes.
const QUOTED_BODY: usize = 300;
/// The largest answer the CLI reads: the API's largest (a page of 200 deliveries, a
/// failure with its 256 KiB payload) is far below it, and a server that streamed
/// without end grew the CLI's memory by hundreds of MB a second.
const LARGEST_ANSWER: usize = 32 * 1024 * 1024;

/// Where the API is and who is calling.
pub struct Client {
    base: String,
    /// `base` as messages show it: without the user and password a URL may carry.
    shown: String,
    key: String,
    /// How long one answer may take (`--timeout`): a server that accepts and never
    /// answers (a hung proxy) held the CLI for good.
    timeout: std::time::Duration,
    http: reqwest::Client,
}

impl Client {
    pub fn new(base: &str, key: &str, timeout: std::time::Duration) -> Result<Self, CliError> {
        let base = base.trim_end_matches('/').to_owned();
        // Not echoed: a URL that does not parse may still hold a password.
        let shown = match reqwest::Url::parse(&base) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => without_credentials(url),
            _ => {
                return Err(CliError(
                    "--url (or ENTREGA_URL) is not an http:// or https:// URL, e.g. \
                     http://127.0.0.1:8787"
                        .into(),
                ))
            }
        };
        if reqwest::header::HeaderValue::from_str(&format!("Bearer {key}")).is_err() {
            return Err(CliError(
                "the API key holds characters a request header cannot carry (a line break, \
                 a control character): check --api-key or ENTREGA_API_KEY"
                    .into(),
            ));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT.min(timeout))
            .timeout(timeout)
            // The API never redirects: a redirect is another server (a login page),
            // and following it would send a resend's request there.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| CliError(format!("cannot make an HTTP client: {e}")))?;
        Ok(Self {
            base,
            shown,
            key: key.to_owned(),
            timeout,
            http,
        })
    }

    /// Send a request; a problem+json answer becomes "title: detail".
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, CliError> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.key);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let (shown, timeout) = (&self.shown, self.timeout);
        let unreached = |e: reqwest::Error| {
            let why = if e.is_timeout() {
                format!("no answer within {timeout:?} (--timeout)")
            } else {
                // Without the URL reqwest puts in its message, which may hold a password;
                // with the causes it leaves out ("connection refused").
                entrega_core::text::with_causes(&e.without_url())
            };
            CliError(format!("cannot reach {shown}: {why}"))
        };
        let mut response = request.send().await.map_err(unreached)?;
        let status = response.status();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(unreached)? {
            if body.len() + chunk.len() > LARGEST_ANSWER {
                return Err(CliError(format!(
                    "{shown} answered with more than {} MiB, not as Entrega's API does \
                     (check --url or ENTREGA_URL)",
                    LARGEST_ANSWER / (1024 * 1024)
                )));
            }
            body.extend_from_slice(&chunk);
        }
        let text = String::from_utf8_lossy(&body).into_owned();
        let json: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status.is_success() {
            // Every answer of the API is a JSON object: anything else (a web page, a
            // proxy's error) is another server, not an empty result.
            if !json.is_object() {
                return Err(CliError(format!(
                    "{shown} answered {} with {}, not as Entrega's API does (check --url or \
                     ENTREGA_URL)",
                    status.as_u16(),
                    quoted(&text)
                )));
            }
            return Ok(json);
        }
        let title = json["title"]
            .as_str()
            .unwrap_or(status.canonical_reason().unwrap_or("error"));
        let detail = match json["detail"].as_str() {
            Some(detail) => shown_text(detail),
            None => quoted(&text),
        };
        let hint = if status == reqwest::StatusCode::UNAUTHORIZED {
            " (check --api-key or ENTREGA_API_KEY)"
        } else {
            ""
        };
        Err(CliError(format!(
            "{} ({}): {detail}{hint}",
            shown_text(title),
            status.as_u16()
        )))
    }

    pub async fn get(&self, path: &str) -> Result<Value, CliError> {
        self.call(reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> Result<Value, CliError> {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }
}

/// `url` without its user and password, for messages.
fn without_credentials(mut url: reqwest::Url) -> String {
    let _ = url.set_password(None);
    let _ = url.set_username("");
    url.to_string().trim_end_matches('/').to_owned()
}

/// Text from the other side, as a message shows it: control characters escaped (see
/// [`cell`]).
fn shown_text(text: &str) -> String {
    cell(&Value::String(text.to_owned()))
}

/// An answer's body in a message: its start (a web page can be long), escaped, or
/// "an empty body".
fn quoted(body: &str) -> String {
    if body.trim().is_empty() {
        return "an empty body".into();
    }
    let start: String = body.chars().take(QUOTED_BODY).collect();
    let more = if start.len() < body.len() { "…" } else { "" };
    format!("`{}{more}`", shown_text(&start))
}

/// `?a=1&b=2` from the parameters that are set.
pub fn query(params: &[(&str, Option<String>)]) -> String {
    let set: Vec<String> = params
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", encode(v))))
        .collect();
    if set.is_empty() {
        String::new()
    } else {
        format!("?{}", set.join("&"))
    }
}

/// An id as one path segment: encoded, so `../endpoints` or `a/b` can never name
/// another route (the dots too: `.` and `..` are path steps).
pub fn segment(id: &str) -> String {
    encode(id).replace('.', "%2E")
}

fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A plain text table: a header row and aligned columns.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut table = comfy_table::Table::new();
    table
        .load_style(comfy_table::presets::NOTHING)
        // Never wrapped to the terminal: ids must stay whole to be copied.
        .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
        .set_header(headers.iter().copied())
        .add_rows(rows.iter().cloned());
    for column in table.column_iter_mut() {
        column.set_padding((0, COLUMN_GAP));
    }
    table
        .lines()
        .map(|line| line.trim_end().to_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Spaces between table columns.
const COLUMN_GAP: u16 = 2;

/// A JSON value as a table cell. Control characters are shown escaped, never sent to
/// the terminal: a name or a response excerpt must not be able to move the cursor,
/// recolour the screen or hide text.
pub fn cell(v: &Value) -> String {
    let text = match v {
        Value::Null => return "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let chars: Vec<char> = text.chars().collect();
    (0..chars.len())
        .map(|i| {
            if entrega_core::text::is_hidden_at(&chars, i) {
                chars[i].escape_unicode().to_string()
            } else {
                chars[i].to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_encoded_and_tables_aligned() {
        assert_eq!(query(&[("a", Some("x y".into())), ("b", None)]), "?a=x%20y");
        assert_eq!(query(&[("a", None)]), "");
        assert_eq!(segment("../endpoints"), "%2E%2E%2Fendpoints");
        assert_eq!(
            cell(&Value::String("\u{1b}[31mred".into())),
            "\\u{1b}[31mred"
        );
        assert_eq!(
            table(&["ID", "S"], &[vec!["abc".into(), "ok".into()]]),
            "ID   S\nabc  ok"
        );
    }

    #[test]
    fn messages_show_no_password_and_no_control_character() {
        let shown = |url: &str| without_credentials(url.parse().unwrap());
        assert_eq!(
            shown("http://user:s3cret@127.0.0.1:1/api"),
            "http://127.0.0.1:1/api"
        );
        assert_eq!(shown("http://127.0.0.1:1"), "http://127.0.0.1:1");
        assert_eq!(quoted("\u{1b}[2Jgone"), "`\\u{1b}[2Jgone`");
        assert_eq!(quoted(" "), "an empty body");
        assert_eq!(quoted(&"x".repeat(1000)).chars().count(), QUOTED_BODY + 3);
    }
}
