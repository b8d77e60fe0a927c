//! What must hold after any simulated run, whatever happened: each check names the
//! seed when it fails.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use entrega_core::delivery::{Delivery, DeliveryState};
use entrega_core::handlers::worker::policy_of;
use entrega_core::outcome::FailureKind;

use super::Sim;

impl Sim {
    /// Every delivery of every published event.
    pub async fn deliveries(&self) -> Vec<Delivery> {
        let mut all = Vec::new();
        for event in &self.published {
            all.extend(
                self.world
                    .services
                    .store
                    .deliveries_of_event(event)
                    .await
                    .unwrap(),
            );
        }
        all
    }

    /// What must hold after any run; panics naming the seed.
    pub async fn check_invariants(&self) {
        let seed = self.seed;
        let store = &self.world.services.store;
        let committed: HashSet<String> = self.published.iter().map(|e| e.id.to_string()).collect();
        let arrivals = self.arrivals();
        for a in &arrivals {
            assert!(
                committed.contains(&a.webhook_id),
                "seed {seed}: {} received {} that nobody published",
                a.url,
                a.webhook_id
            );
        }
        let mut seen_twice = HashMap::<(&str, &str), usize>::new();
        for a in arrivals
            .iter()
            .filter(|a| self.at_most_once.contains(&a.url))
        {
            *seen_twice.entry((&a.url, &a.webhook_id)).or_default() += 1;
        }
        for ((url, id), times) in seen_twice {
            assert!(
                times <= 1,
                "seed {seed}: at-most-once {url} received {id} {times} times"
            );
        }
        let (mut completed, mut interrupted) = (0, 0);
        for delivery in self.deliveries().await {
            let attempts = store.list_attempts(&delivery.id).await.unwrap();
            for a in &attempts {
                match a.failure_kind {
                    Some(FailureKind::Interrupted) => interrupted += 1,
                    _ => completed += 1,
                }
            }
            let endpoint = store.get_endpoint(&delivery.endpoint_id).await.unwrap();
            match delivery.state {
                DeliveryState::Delivered => {}
                // Waiting for a human to re-enable its endpoint.
                DeliveryState::Paused if endpoint.as_ref().is_some_and(|e| e.disabled) => {}
                state if state.is_terminal() => {
                    // The record support reads instead of the log: the payload to
                    // resend, when each attempt of this generation was made, and why
                    // the last one failed.
                    let failures = store.failures_of_delivery(&delivery.id).await.unwrap();
                    let payload = self
                        .published
                        .iter()
                        .find(|e| e.id == delivery.event_id)
                        .map(|e| e.payload.as_str());
                    let times: Vec<_> = attempts
                        .iter()
                        .filter(|a| a.generation == delivery.generation)
                        .map(|a| a.started_at)
                        .collect();
                    assert!(
                        failures.iter().any(|f| Some(f.payload.as_str()) == payload
                            && f.attempt_times == times
                            && f.last_error == delivery.last_error),
                        "seed {seed}: {} ended {state:?} without a full failure record: {failures:#?}",
                        delivery.id
                    );
                }
                state => {
                    let queued = self
                        .world
                        .deliveries
                        .bodies()
                        .into_iter()
                        .filter(|b| b.contains(delivery.id.as_str()))
                        .count();
                    panic!(
                        "seed {seed}: {} still {state:?} after the run ({queued} messages for it queued)\n{delivery:?}\n{attempts:#?}",
                        delivery.id
                    )
                }
            }
            let Some(endpoint) = endpoint else {
                continue;
            };
            let policy = policy_of(&endpoint);
            for pair in attempts.windows(2) {
                let (before, after) = (&pair[0], &pair[1]);
                // A new generation starts at once (a resend), and an attempt whose
                // outcome a crash lost is sent again as soon as that is known.
                let interrupted = before.failure_kind == Some(FailureKind::Interrupted);
                if before.generation != after.generation || interrupted {
                    continue;
                }
                let scheduled = policy.delays()[before.number as usize - 1];
                let earliest = scheduled.mul_f64(1.0 - policy.jitter());
                let waited = (after.started_at - before.started_at)
                    .to_std()
                    .unwrap_or_default();
                assert!(
                    waited + Duration::from_millis(1) >= earliest,
                    "seed {seed}: attempt {} of {} came after {waited:?}, before its schedule ({earliest:?})",
                    after.number,
                    delivery.id
                );
            }
        }
        // Every request an endpoint saw is in the log: with its outcome, or as an
        // interrupted attempt when the process died before reading the answer (a
        // crash before the send is also logged as interrupted, hence the range).
        assert!(
            completed <= arrivals.len() && arrivals.len() <= completed + interrupted,
            "seed {seed}: {} requests seen, {completed} attempts logged with an outcome and {interrupted} interrupted",
            arrivals.len()
        );
    }
}
