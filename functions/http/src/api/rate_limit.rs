//! Per-key API rate limiting: a token bucket per API key (by hash), refilled at N
//! requests a second up to a burst of 2N; over it, 429 with `Retry-After`. Independent
//! of webhook delivery, which never waits on it. On Lambda each instance keeps its own
//! buckets, so the limit there is per instance.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use entrega_core::tenant::hash_api_key;

use super::problem::ApiError;
use super::AppState;

/// Requests per second per key when the operator sets none.
pub const DEFAULT_RATE_PER_SECOND: u32 = 50;
/// The burst is this many seconds' worth of requests.
const BURST_SECONDS: f64 = 2.0;
/// Buckets kept at most; idle full ones are dropped first (a flood of made-up keys
/// must not grow memory without bound).
const MAX_BUCKETS: usize = 100_000;

struct Bucket {
    tokens: f64,
    refilled: Instant,
}

pub struct RateLimiter {
    per_second: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimiter {
    pub fn new(per_second: u32) -> Self {
        Self {
            per_second: f64::from(per_second.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn burst(&self) -> f64 {
        self.per_second * BURST_SECONDS
    }

    /// Take a token for `key`; `Err(seconds)` to wait when there is none.
    pub fn take(&self, key: &str, now: Instant) -> Result<(), u64> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(key) {
            let (rate, burst) = (self.per_second, self.burst());
            buckets.retain(|_, b| {
                b.tokens + now.duration_since(b.refilled).as_secs_f64() * rate < burst
            });
        }
        let burst = self.burst();
        let bucket = buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens: burst,
            refilled: now,
        });
        let elapsed = now.saturating_duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.per_second).min(burst);
        bucket.refilled = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - bucket.tokens) / self.per_second).ceil().max(1.0) as u64)
        }
    }
}

/// `ENTREGA_API_RATE_LIMIT` (requests per second per key), as the API function reads it.
pub fn rate_limit_from_env() -> u32 {
    std::env::var("ENTREGA_API_RATE_LIMIT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_RATE_PER_SECOND)
}

/// The middleware: keyed requests spend a token; unkeyed ones pass (and get a 401).
pub async fn limit(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let key = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if let (Some(limiter), Some(key)) = (&state.limiter, key) {
        if let Err(wait) = limiter.take(&hash_api_key(key.trim()), Instant::now()) {
            return ApiError::too_many_requests(wait).into_response();
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn burst_then_refill_per_key() {
        let limiter = RateLimiter::new(5);
        let t0 = Instant::now();
        for _ in 0..10 {
            assert!(limiter.take("a", t0).is_ok());
        }
        assert_eq!(limiter.take("a", t0), Err(1));
        assert!(limiter.take("b", t0).is_ok(), "keys are independent");
        assert!(
            limiter.take("a", t0 + Duration::from_millis(200)).is_ok(),
            "one token back after 1/5 s"
        );
        assert!(limiter.take("a", t0 + Duration::from_millis(200)).is_err());
    }
}
