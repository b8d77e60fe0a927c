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
    /// The embedded store's purge of what has outlived the retention period.
    Retention,
    /// A drain of a producer's PostgreSQL outbox.
    ProducerOutbox,
}

/// One component failing since `since`, for `reason`, `occurrences` times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failing {
    pub component: Component,
    /// Which one, where a component runs several times (each producer outbox).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    pub reason: String,
    pub since: DateTime<Utc>,
    /// When it last happened.
    pub last: DateTime<Utc>,
    pub occurrences: u64,
}

/// The conditions of one process.
#[derive(Debug, Default)]
pub struct Conditions {
    failing: Mutex<BTreeMap<(Component, String), Failing>>,
}

impl Conditions {
    /// `component` failed with `reason`: logged when the condition starts or its reason
    /// changes, counted otherwise.
    pub fn failing(&self, component: Component, reason: &str, now: DateTime<Utc>) {
        self.failing_at(component, "", reason, now);
    }

    /// As [`Self::failing`], for one `instance` of a component that runs several
    /// times: each instance is its own condition, so one that works does not clear
    /// another that fails.
    pub fn failing_at(
        &self,
        component: Component,
        instance: &str,
        reason: &str,
        now: DateTime<Utc>,
    ) {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        let key = (component, instance.to_owned());
        match failing.get_mut(&key) {
            Some(f) if f.reason == reason => {
                f.occurrences += 1;
                f.last = now;
            }
            _ => {
                tracing::error!(
                    ?component,
                    instance,
                    reason,
                    "failing; retrying with backoff (logged once until it changes)"
                );
                failing.insert(
                    key,
                    Failing {
                        component,
                        instance: (!instance.is_empty()).then(|| instance.to_owned()),
                        reason: reason.to_owned(),
                        since: now,
                        last: now,
                        occurrences: 1,
                    },
                );
            }
        }
    }

    /// `component` works again.
    pub fn recovered(&self, component: Component) {
        self.recovered_at(component, "");
    }

    /// `instance` of `component` works again.
    pub fn recovered_at(&self, component: Component, instance: &str) {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = failing.remove(&(component, instance.to_owned())) {
            tracing::warn!(?component, instance, failed = f.occurrences, since = %f.since, "recovered");
        }
    }

    /// Forget `component`'s condition if it has not happened for `quiet_for`: for a
    /// component that learns of a failure only when it tries, and tries only when asked
    /// (the API's writes), a failure not seen again for that long is no evidence that
    /// it lasts.
    pub fn forget_if_quiet(
        &self,
        component: Component,
        quiet_for: std::time::Duration,
        now: DateTime<Utc>,
    ) {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        let key = (component, String::new());
        let quiet = failing.get(&key).is_some_and(|f| {
            (now - f.last)
                .to_std()
                .is_ok_and(|quiet| quiet >= quiet_for)
        });
        if quiet {
            if let Some(f) = failing.remove(&key) {
                tracing::warn!(
                    ?component,
                    failed = f.occurrences,
                    since = %f.since,
                    last = %f.last,
                    "no longer reported: it has not failed for {} s",
                    quiet_for.as_secs()
                );
            }
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

    #[test]
    fn a_condition_quiet_for_long_enough_is_forgotten() {
        let c = Conditions::default();
        let start = Utc::now();
        let hold = std::time::Duration::from_secs(10);
        c.failing(Component::Api, "disk full", start);
        c.failing(
            Component::Api,
            "disk full",
            start + chrono::Duration::seconds(8),
        );
        c.failing(Component::Outbox, "down", start);
        c.forget_if_quiet(Component::Api, hold, start + chrono::Duration::seconds(17));
        assert_eq!(
            c.current().len(),
            2,
            "quiet for 9 s since its last occurrence: still reported"
        );
        assert_eq!(c.current()[0].since, start, "since its first occurrence");
        c.forget_if_quiet(Component::Api, hold, start + chrono::Duration::seconds(18));
        let current = c.current();
        assert_eq!(current.len(), 1, "{current:?}");
        assert_eq!(current[0].component, Component::Outbox, "others stay");
    }

    #[test]
    fn instances_of_a_component_are_conditions_of_their_own() {
        let c = Conditions::default();
        let now = Utc::now();
        c.failing_at(
            Component::ProducerOutbox,
            "postgres a:5432/crm",
            "down",
            now,
        );
        c.recovered_at(Component::ProducerOutbox, "postgres b:5432/crm");
        assert_eq!(
            c.current().len(),
            1,
            "another instance's recovery clears nothing"
        );
        assert_eq!(
            c.current()[0].instance.as_deref(),
            Some("postgres a:5432/crm")
        );
        c.recovered_at(Component::ProducerOutbox, "postgres a:5432/crm");
        assert!(c.current().is_empty());
    }
}
