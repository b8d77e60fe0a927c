//! Per-key API rate limiting with `governor` (GCRA, keyed): N requests a second per API
//! key (by hash) with a burst of 2N; over it, 429 with `Retry-After`. Independent of
//! webhook delivery, which never waits on it. On Lambda each instance keeps its own
//! state, so the limit there is per instance.

use std::num::NonZeroU32;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use entrega_core::tenant::hash_api_key;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

use super::problem::ApiError;
use super::AppState;

/// Requests per second per key when the operator sets none.
pub const DEFAULT_RATE_PER_SECOND: u32 = 50;
/// The burst is this many seconds' worth of requests.
const BURST_SECONDS: u32 = 2;
/// Keys tracked before idle ones are dropped (a flood of made-up keys must not grow
/// memory without bound).
const MAX_KEYS: usize = 100_000;

pub struct RateLimiter {
    limiter: DefaultKeyedRateLimiter<String>,
    clock: DefaultClock,
}

impl RateLimiter {
    pub fn new(per_second: u32) -> Self {
        let rate = NonZeroU32::new(per_second.max(1)).expect("at least 1");
        let burst = rate.saturating_mul(NonZeroU32::new(BURST_SECONDS).expect("non-zero"));
        Self {
            limiter: DefaultKeyedRateLimiter::keyed(Quota::per_second(rate).allow_burst(burst)),
            clock: DefaultClock::default(),
        }
    }

    /// Spend one request of `key`; `Err(seconds)` to wait when it has none left.
    pub fn take(&self, key: &str) -> Result<(), u64> {
        if self.limiter.len() >= MAX_KEYS {
            // Keys whose bucket is full again carry no state worth keeping.
            self.limiter.retain_recent();
            self.limiter.shrink_to_fit();
        }
        self.limiter
            .check_key(&key.to_owned())
            .map_err(|not_until| {
                let wait: Duration = not_until.wait_time_from(self.clock.now());
                wait.as_secs_f64().ceil().max(1.0) as u64
            })
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
        if let Err(wait) = limiter.take(&hash_api_key(key.trim())) {
            return ApiError::too_many_requests(wait).into_response();
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_refill_per_key() {
        let limiter = RateLimiter::new(5);
        for _ in 0..10 {
            assert!(limiter.take("a").is_ok());
        }
        assert_eq!(limiter.take("a"), Err(1));
        assert!(limiter.take("b").is_ok(), "keys are independent");
        std::thread::sleep(Duration::from_millis(250));
        assert!(limiter.take("a").is_ok(), "one request back after 1/5 s");
        assert!(limiter.take("a").is_err());
    }
}
