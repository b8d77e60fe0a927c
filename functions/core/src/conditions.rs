//! Operational conditions: what is failing right now (the store refusing writes, a
//! poller's backend), logged once when it starts and once when it ends — never once
//! per retry — and reported by `/healthz` while it lasts.

use std::collections::BTreeMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use serde::Serialize;

/// The parts of a runtime whose failures are conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Component {
    /// The API's writes to the store.
    Api,
    /// The outbox trigger (fan-out).
    Outbox,
    /// The delivery worker's queue.
    Deliveries,
    /// The failure handler's queue.
    Failures,
    /// The scheduled 24-hour check.
    AgeCheck,
    /// The scheduled sweep for deliveries whose message was lost.
    Sweeper,
    /// A drain of a producer's PostgreSQL outbox.
    ProducerOutbox,
}

/// One component failing since `since`, for `reason`, `occurrences` times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failing {
    pub component: Component,
    pub reason: String,
    pub since: DateTime<Utc>,
    pub occurrences: u64,
}

/// The conditions of one process.
#[derive(Debug, Default)]
pub struct Conditions {
    failing: Mutex<BTreeMap<Component, Failing>>,
}

impl Conditions {
    /// `component` failed with `reason`: logged when the condition starts or its reason
    /// changes, counted otherwise.
    pub fn failing(&self, component: Component, reason: &str, now: DateTime<Utc>) {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        match failing.get_mut(&component) {
            Some(f) if f.reason == reason => f.occurrences += 1,
            _ => {
                tracing::error!(
                    ?component,
                    reason,
                    "failing; retrying with backoff (logged once until it changes)"
                );
                failing.insert(
                    component,
                    Failing {
                        component,
                        reason: reason.to_owned(),
                        since: now,
                        occurrences: 1,
                    },
                );
            }
        }
    }

    /// `component` works again.
    pub fn recovered(&self, component: Component) {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = failing.remove(&component) {
            tracing::warn!(?component, failed = f.occurrences, since = %f.since, "recovered");
        }
    }

    /// What is failing now.
    pub fn current(&self) -> Vec<Failing> {
        let failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        failing.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_is_recorded_once_and_cleared() {
        let c = Conditions::default();
        let now = Utc::now();
        for _ in 0..1000 {
            c.failing(Component::Outbox, "disk full", now);
        }
        let current = c.current();
        assert_eq!(current.len(), 1);
        assert_eq!(current[0].occurrences, 1000);
        c.recovered(Component::Outbox);
        assert!(c.current().is_empty());
    }
}
