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

/// Where the API is and who is calling.
pub struct Client {
    base: String,
    key: String,
    http: reqwest::Client,
}

impl Client {
    pub fn new(base: &str, key: &str) -> Self {
        Self {
            base: base.trim_end_matches('/').to_owned(),
            key: key.to_owned(),
            http: reqwest::Client::new(),
        }
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
        let response = request
            .send()
            .await
            .map_err(|e| CliError(format!("cannot reach {}: {e}", self.base)))?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let json: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(json);
        }
        let title = json["title"]
            .as_str()
            .unwrap_or(status.canonical_reason().unwrap_or("error"));
        let detail = json["detail"].as_str().unwrap_or(text.as_str());
        let hint = if status == reqwest::StatusCode::UNAUTHORIZED {
            " (check --api-key or ENTREGA_API_KEY)"
        } else {
            ""
        };
        Err(CliError(format!(
            "{title} ({}): {detail}{hint}",
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
}
