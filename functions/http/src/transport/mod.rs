//! The delivery transport: one signed POST per attempt, over reqwest with rustls.
//!
//! Per-attempt timeout, redirects never followed, the response body read only up to
//! [`MAX_RESPONSE_BYTES`] (a receiver cannot make a worker buffer gigabytes), and every
//! target address checked by the SSRF guard at connect time.

pub mod guard;

use std::error::Error as StdError;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::delivery::{truncate_utf8, RESPONSE_EXCERPT_BYTES};
use entrega_core::outcome::{FailureKind, TransportResult};
use entrega_core::ports::{SignedRequest, Transport};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

pub use guard::{TargetError, TargetPolicy};

/// Most response-body bytes read per attempt; the rest is never read.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024;
/// Idle keep-alive connections kept per host: as many as a process runs attempts at
/// once (the embedded runtime's 64 slots; a Lambda batch is at most 10), so a busy
/// endpoint's connections are all reused. With fewer, every attempt past that number
/// closed its connection and the next one opened a new one: a connect and a shutdown
/// per attempt, a fifth of the worker's time at 64 in flight.
const IDLE_CONNECTIONS_PER_HOST: usize = 64;
/// How long an idle connection is kept for reuse.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// A refused target, carried through reqwest's error chain so it can be told apart
/// from an ordinary connection failure.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Refused(TargetError);

/// A name that did not resolve.
#[derive(Debug, thiserror::Error)]
#[error("DNS lookup of {0} failed: {1}")]
struct DnsFailure(String, String);

/// Resolves names and hands reqwest only addresses the guard accepts: what is checked
/// is exactly what is connected to.
struct GuardedResolver {
    policy: Arc<TargetPolicy>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(|e| DnsFailure(host.clone(), e.to_string()))?
                .collect();
            if addrs.is_empty() {
                return Err(DnsFailure(host, "no addresses".into()).into());
            }
            // One forbidden answer refuses the name: a name that mixes public and private
            // addresses is a rebinding attempt or a misconfiguration, not a target.
            for addr in &addrs {
                policy.check_ip(addr.ip()).map_err(Refused)?;
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// The production transport.
pub struct HttpTransport {
    client: reqwest::Client,
    policy: Arc<TargetPolicy>,
}

impl HttpTransport {
    pub fn new(policy: TargetPolicy) -> Self {
        let policy = Arc::new(policy);
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(Arc::new(GuardedResolver {
                policy: policy.clone(),
            }))
            .pool_max_idle_per_host(IDLE_CONNECTIONS_PER_HOST)
            .pool_idle_timeout(IDLE_TIMEOUT)
            .no_proxy()
            .build()
            .expect("the HTTP client configuration is valid");
        Self { client, policy }
    }

    pub fn policy(&self) -> &TargetPolicy {
        &self.policy
    }

    async fn attempt(&self, request: &SignedRequest) -> TransportResult {
        let url = match self.policy.check_url(&request.url) {
            Ok(url) => url,
            Err(e) => {
                return TransportResult::Failed {
                    kind: FailureKind::TargetRefused,
                    message: e.to_string(),
                }
            }
        };
        let mut builder = self.client.post(url).body(request.body.clone());
        for (name, value) in &request.headers {
            builder = builder.header(name, value);
        }
        let mut response = match builder.send().await {
            Ok(r) => r,
            Err(e) => return failed(&e),
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let mut body = Vec::new();
        // The status decides the outcome; the body is only for the log, so a body
        // that breaks off (or runs past the cap) still leaves the status standing.
        while body.len() < MAX_RESPONSE_BYTES {
            match response.chunk().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) | Err(_) => break,
            }
        }
        let text = String::from_utf8_lossy(&body[..body.len().min(RESPONSE_EXCERPT_BYTES + 4)]);
        TransportResult::Response {
            status,
            retry_after,
            excerpt: truncate_utf8(&text, RESPONSE_EXCERPT_BYTES).to_owned(),
        }
    }
}

#[async_trait]
impl Transport for HttpTransport {
    async fn send(&self, request: &SignedRequest) -> TransportResult {
        // One deadline for everything: connecting, sending, and reading the body.
        match tokio::time::timeout(request.timeout, self.attempt(request)).await {
            Ok(result) => result,
            Err(_) => TransportResult::Failed {
                kind: FailureKind::Timeout,
                message: format!(
                    "no complete answer within {} ms",
                    request.timeout.as_millis()
                ),
            },
        }
    }
}

/// Classify a reqwest error by walking its cause chain. The message is the whole
/// chain: reqwest's own stops at "error sending request for url (…)", which a support
/// person cannot tell apart from one failure to the next (a peer that closed, a head
/// too large, a status line that is not HTTP; a hostile test).
fn failed(error: &reqwest::Error) -> TransportResult {
    let mut kind = if error.is_timeout() {
        FailureKind::Timeout
    } else {
        FailureKind::Transport
    };
    let mut message = entrega_core::text::with_causes(error);
    let mut cause: Option<&(dyn StdError + 'static)> = error.source();
    while let Some(err) = cause {
        if let Some(refused) = err.downcast_ref::<Refused>() {
            kind = FailureKind::TargetRefused;
            message = refused.to_string();
            break;
        }
        if let Some(dns) = err.downcast_ref::<DnsFailure>() {
            kind = FailureKind::Dns;
            message = dns.to_string();
            break;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => kind = FailureKind::ConnectionRefused,
                std::io::ErrorKind::TimedOut => kind = FailureKind::Timeout,
                _ => {}
            }
        }
        let text = err.to_string().to_ascii_lowercase();
        if kind == FailureKind::Transport
            && (text.contains("certificate") || text.contains("tls") || text.contains("handshake"))
        {
            kind = FailureKind::Tls;
        }
        cause = err.source();
    }
    TransportResult::Failed { kind, message }
}

#[cfg(test)]
mod tests;
