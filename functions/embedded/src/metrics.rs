//! The embedded runtime's metrics, served at `GET /metrics` (admin key or metrics
//! token) in Prometheus text format, kept with the official `prometheus-client`
//! crate: attempts by outcome per tenant and endpoint, histograms of response time and
//! publish → delivered latency (so percentiles can be computed), failures per tenant,
//! each tenant's waiting backlog, and the age of the oldest unacknowledged failure.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use entrega_core::ids::{EndpointId, TenantId};
use entrega_core::outcome::FailureKind;
use entrega_core::ports::{AttemptMetric, Metrics};
use entrega_core::producer_outbox::QuarantineReason;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Histogram buckets in seconds: 1 ms to about 33 s, doubling (the 30 s timeout fits).
const BUCKET_START_S: f64 = 0.001;
const BUCKET_FACTOR: f64 = 2.0;
const BUCKETS: u16 = 16;

/// The `outcome` label of an attempt that succeeded (the others are failure kinds).
const SUCCESS: &str = "success";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AttemptLabels {
    tenant: String,
    endpoint: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    tenant: String,
    endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabels {
    tenant: String,
}

fn histogram() -> Histogram {
    Histogram::new(exponential_buckets(BUCKET_START_S, BUCKET_FACTOR, BUCKETS))
}

pub struct PrometheusMetrics {
    registry: Registry,
    attempts: Family<AttemptLabels, Counter>,
    response: Family<EndpointLabels, Histogram, fn() -> Histogram>,
    latency: Family<EndpointLabels, Histogram, fn() -> Histogram>,
    failures: Family<TenantLabels, Counter>,
    backlog: Family<TenantLabels, Gauge<u64, AtomicU64>>,
    oldest_unacknowledged: Gauge<u64, AtomicU64>,
    worker_slots: Gauge<u64, AtomicU64>,
    slow_slots: Gauge<u64, AtomicU64>,
    swept: Counter,
    outbox_drained: Counter,
    outbox_quarantined: Family<ReasonLabels, Counter>,
}

impl Default for PrometheusMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("entrega");
        let attempts = Family::<AttemptLabels, Counter>::default();
        let response: Family<EndpointLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(histogram);
        let latency: Family<EndpointLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(histogram);
        let failures = Family::<TenantLabels, Counter>::default();
        let backlog = Family::<TenantLabels, Gauge<u64, AtomicU64>>::default();
        let oldest_unacknowledged = Gauge::<u64, AtomicU64>::default();
        let worker_slots = Gauge::<u64, AtomicU64>::default();
        let slow_slots = Gauge::<u64, AtomicU64>::default();
        let swept = Counter::default();
        let outbox_drained = Counter::default();
        let outbox_quarantined = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "producer_outbox_events",
            "Rows of producers' PostgreSQL outboxes that became events",
            outbox_drained.clone(),
        );
        registry.register(
            "producer_outbox_quarantined",
            "Rows of producers' PostgreSQL outboxes moved to quarantine, by reason",
            outbox_quarantined.clone(),
        );
        registry.register("attempts", "Delivery attempts by outcome", attempts.clone());
        registry.register(
            "response_seconds",
            "Receiver response time",
            response.clone(),
        );
        registry.register(
            "delivery_latency_seconds",
            "Publish to delivered",
            latency.clone(),
        );
        registry.register("failures", "Deliveries moved to failures", failures.clone());
        registry.register(
            "backlog",
            "Deliveries and events waiting, per tenant",
            backlog.clone(),
        );
        registry.register(
            "oldest_unacknowledged_failure_age_seconds",
            "Age of the oldest unacknowledged failure (0: none)",
            oldest_unacknowledged.clone(),
        );
        registry.register(
            "worker_slots_in_use",
            format!(
                "Attempts in the embedded worker's slots (of {})",
                crate::runtime::WORKER_SLOTS
            ),
            worker_slots.clone(),
        );
        registry.register(
            "slow_slots_in_use",
            format!(
                "Attempts in the embedded worker's slow slots (of {}): endpoints slow lately",
                crate::runtime::SLOW_SLOTS + crate::runtime::KEPT_SLOT_MOVES
            ),
            slow_slots.clone(),
        );
        registry.register(
            "deliveries_swept",
            "Deliveries queued again by the sweeper (their message was lost)",
            swept.clone(),
        );
        Self {
            registry,
            attempts,
            response,
            latency,
            failures,
            backlog,
            oldest_unacknowledged,
            worker_slots,
            slow_slots,
            swept,
            outbox_drained,
            outbox_quarantined,
        }
    }
}

impl Metrics for PrometheusMetrics {
    fn attempt(&self, m: &AttemptMetric) {
        let (tenant, endpoint) = (m.tenant_id.to_string(), m.endpoint_id.to_string());
        let outcome = m.failure.map_or(SUCCESS, |k| k.as_str()).to_owned();
        self.attempts
            .get_or_create(&AttemptLabels {
                tenant: tenant.clone(),
                endpoint: endpoint.clone(),
                outcome,
            })
            .inc();
        let labels = EndpointLabels { tenant, endpoint };
        self.response
            .get_or_create(&labels)
            .observe(m.response_ms as f64 / 1000.0);
        if let Some(latency) = m.delivery_latency_ms {
            self.latency
                .get_or_create(&labels)
                .observe(latency as f64 / 1000.0);
        }
    }

    /// Why: each endpoint ever attempted kept its series (two histograms and a counter
    /// per outcome, about 40 lines) until a restart, so a tenant that created, used
    /// and deleted endpoints in a loop grew every scrape and the process without
    /// bound (a hostile test: 7 861 lines after 200 rounds).
    fn endpoint_deleted(&self, tenant: &TenantId, endpoint: &EndpointId) {
        let labels = EndpointLabels {
            tenant: tenant.to_string(),
            endpoint: endpoint.to_string(),
        };
        self.response.remove(&labels);
        self.latency.remove(&labels);
        let outcomes = FailureKind::ALL.iter().map(|k| k.as_str());
        for outcome in std::iter::once(SUCCESS).chain(outcomes) {
            self.attempts.remove(&AttemptLabels {
                tenant: labels.tenant.clone(),
                endpoint: labels.endpoint.clone(),
                outcome: outcome.to_owned(),
            });
        }
    }

    fn failure(&self, tenant: &TenantId) {
        self.failures
            .get_or_create(&TenantLabels {
                tenant: tenant.to_string(),
            })
            .inc();
    }

    fn deliveries_swept(&self, count: u64) {
        self.swept.inc_by(count);
    }

    fn producer_outbox_drained(&self, count: u64) {
        self.outbox_drained.inc_by(count);
    }

    fn producer_outbox_quarantined(&self, reason: QuarantineReason) {
        self.outbox_quarantined
            .get_or_create(&ReasonLabels {
                reason: reason.as_str().to_owned(),
            })
            .inc();
    }

    fn oldest_unacknowledged_failure(&self, age: Option<Duration>) {
        self.oldest_unacknowledged
            .set(age.map_or(0, |a| a.as_secs()));
    }
}

impl PrometheusMetrics {
    /// The embedded worker's slots in use now (see [`crate::runtime::WorkerSlots`]).
    pub fn slots_in_use(&self, worker: usize, slow: usize) {
        self.worker_slots.set(worker as u64);
        self.slow_slots.set(slow as u64);
    }

    /// The exposition text, with the backlog gauges set from `backlog` first.
    pub fn render(&self, backlog: &[(String, u64)]) -> String {
        self.backlog.clear();
        for (tenant, waiting) in backlog {
            self.backlog
                .get_or_create(&TenantLabels {
                    tenant: tenant.clone(),
                })
                .set(*waiting);
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}
