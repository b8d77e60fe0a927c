//! The operator's tuning, one typed set for both runtimes: the embedded runtime fills it
//! from `serve`'s flags, the Lambda functions from the template's parameters.

use std::time::Duration;

/// Tuning the operator sets; the same names on both runtimes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Failures per tenant per hour above which on-call is alerted.
    pub alert_threshold: u64,
    /// An endpoint failing every attempt this long is disabled.
    pub unhealthy_after: Duration,
    /// A failure unacknowledged this long is surfaced again.
    pub max_unacknowledged_age: Duration,
    /// Waiting deliveries per tenant past which publishing answers 429.
    pub max_backlog: u64,
    /// Attempts at endpoints slow lately in flight at once, all together, across every
    /// worker (0: no such share). On AWS a slice of the worker's concurrency, so that
    /// endpoints that hang never hold every invocation; the embedded runtime moves
    /// slow attempts out of its worker slots instead, and keeps none.
    pub slow_endpoint_share: u32,
    /// Attempts at any one endpoint in flight at once, across every worker, whatever
    /// its `max_concurrency` (0: no such cap). On AWS a slice of the worker's
    /// concurrency: an endpoint is marked slow only when one of its attempts ends, so
    /// until then this is all an endpoint that starts hanging can hold (its attempts
    /// each hold an invocation for a timeout). The embedded runtime keeps none.
    pub one_endpoint_share: u32,
}

/// Waiting deliveries per tenant past which publishing is refused (DESIGN.md).
pub const DEFAULT_MAX_BACKLOG: u64 = 1_000_000;

impl Default for Settings {
    fn default() -> Self {
        Self {
            alert_threshold: crate::handlers::failures::DEFAULT_ALERT_THRESHOLD,
            unhealthy_after: crate::handlers::health::DEFAULT_UNHEALTHY_AFTER,
            max_unacknowledged_age: crate::handlers::age::MAX_UNACKNOWLEDGED_AGE,
            max_backlog: DEFAULT_MAX_BACKLOG,
            slow_endpoint_share: 0,
            one_endpoint_share: 0,
        }
    }
}
