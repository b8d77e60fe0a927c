//! `entrega listen`: a webhook receiver for development. It prints each webhook it
//! gets — id, type, whether the signature verifies (and why not), the body pretty
//! printed — and answers with a chosen status after a chosen delay, so a developer
//! can watch deliveries arrive and rehearse failures without writing a receiver.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use entrega_core::signature::{verify, Secret, DEFAULT_TOLERANCE_SECS};
use tokio::sync::Notify;

use crate::serve::BoxError;

/// What `entrega listen` was asked to do.
#[derive(Debug, Clone)]
pub struct ListenConfig {
    pub listen: SocketAddr,
    /// The endpoint's `whsec_…` secret: signatures are checked with it.
    pub secret: Option<Secret>,
    /// The status every webhook is answered with.
    pub status: StatusCode,
    /// How long to wait before answering (past the endpoint's timeout: a timeout).
    pub delay: Duration,
    /// Stop after this many webhooks (for scripts); `None`: until Ctrl-C.
    pub count: Option<u64>,
}

/// Parse a delay such as `250ms`, `12s`, `2m` or a bare number of seconds.
pub fn parse_delay(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a delay like 250ms, 12s or 2m"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => return Err(format!("`{text}`: the unit must be ms, s or m")),
    };
    if !(0.0..=3600.0).contains(&seconds) {
        return Err(format!("`{text}`: at most an hour"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// What a received webhook's signature says, in words.
pub fn check_signature(secret: Option<&Secret>, headers: &HeaderMap, body: &[u8]) -> String {
    let Some(secret) = secret else {
        return "not checked (start with --secret whsec_… to verify)".into();
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(id), Some(timestamp), Some(signature)) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    ) else {
        return "✗ missing webhook-id, webhook-timestamp or webhook-signature".into();
    };
    let Ok(timestamp) = timestamp.parse::<i64>() else {
        return "✗ webhook-timestamp is not a number".into();
    };
    let now = chrono::Utc::now().timestamp();
    match verify(
        std::slice::from_ref(secret),
        id,
        timestamp,
        body,
        signature,
        now,
        DEFAULT_TOLERANCE_SECS,
    ) {
        Ok(()) => "✓ verified".into(),
        Err(e) => format!("✗ {e}"),
    }
}

/// The report printed for one webhook.
pub fn describe(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
    signature: &str,
) -> String {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let event_type = parsed
        .as_ref()
        .and_then(|v| v.get("type"))
        .and_then(|t| t.as_str())
        .unwrap_or("-")
        .to_owned();
    let pretty = match &parsed {
        Some(v) => serde_json::to_string_pretty(v).unwrap_or_default(),
        None => String::from_utf8_lossy(body).into_owned(),
    };
    format!(
        "── {method} {uri}\n   id        {}\n   type      {event_type}\n   signature {signature}\n{pretty}\n",
        header("webhook-id"),
    )
}

/// Receive until Ctrl-C (or `count` webhooks).
pub async fn listen(config: ListenConfig) -> Result<(), BoxError> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| {
            format!(
                "cannot listen on {}: {e}; choose another port with --port",
                config.listen
            )
        })?;
    let addr = listener.local_addr()?;
    println!(
        "entrega listen: receiving on http://{addr}/ (answering {}{}); Ctrl-C stops",
        config.status.as_u16(),
        if config.delay.is_zero() {
            String::new()
        } else {
            format!(" after {:?}", config.delay)
        }
    );
    let received = Arc::new(AtomicU64::new(0));
    let done = Arc::new(Notify::new());
    let config = Arc::new(config);
    let app = axum::Router::new().fallback({
        let (received, done, config) = (received.clone(), done.clone(), config.clone());
        move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let (received, done, config) = (received.clone(), done.clone(), config.clone());
            async move {
                let signature = check_signature(config.secret.as_ref(), &headers, &body);
                println!("{}", describe(&method, &uri, &headers, &body, &signature));
                tokio::time::sleep(config.delay).await;
                println!("   → answered {}", config.status.as_u16());
                let n = received.fetch_add(1, Ordering::SeqCst) + 1;
                if config.count.is_some_and(|c| n >= c) {
                    done.notify_one();
                }
                config.status
            }
        }
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = done.notified() => {}
            }
        })
        .await?;
    println!(
        "entrega listen: stopped after {} webhook(s)",
        received.load(Ordering::SeqCst)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_read_as_people_write_them() {
        assert_eq!(parse_delay("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_delay("12s"), Ok(Duration::from_secs(12)));
        assert_eq!(parse_delay("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_delay("3"), Ok(Duration::from_secs(3)));
        assert!(parse_delay("soon").is_err());
        assert!(parse_delay("5h").is_err());
        assert!(parse_delay("2m").is_ok());
    }

    #[test]
    fn signatures_are_checked_and_explained() {
        let secret = Secret::generate();
        let body = br#"{"type":"a.b","timestamp":"t","data":{}}"#;
        let now = chrono::Utc::now().timestamp();
        let mut headers = HeaderMap::new();
        headers.insert("webhook-id", "evt_1".parse().unwrap());
        headers.insert("webhook-timestamp", now.to_string().parse().unwrap());
        let signed = secret.sign("evt_1", now, body);
        headers.insert("webhook-signature", signed.parse().unwrap());
        assert_eq!(check_signature(Some(&secret), &headers, body), "✓ verified");
        let other = Secret::generate();
        assert!(check_signature(Some(&other), &headers, body).starts_with('✗'));
        assert!(check_signature(None, &headers, body).starts_with("not checked"));
        headers.remove("webhook-id");
        assert!(check_signature(Some(&secret), &headers, body).contains("missing"));
    }
}
