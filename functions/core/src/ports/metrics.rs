//! The metrics port: what the handlers measure, whoever records it.

use std::time::Duration;

use crate::ids::{EndpointId, TenantId};

/// What one attempt measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptMetric {
    pub tenant_id: TenantId,
    pub endpoint_id: EndpointId,
    /// `None` for a success.
    pub failure: Option<crate::outcome::FailureKind>,
    pub response_ms: u64,
    /// Publish → delivered, for the attempt that delivered.
    pub delivery_latency_ms: Option<u64>,
}

/// Where measurements go: CloudWatch (Embedded Metric Format) from the Lambdas, a
/// Prometheus registry in the embedded runtime. Recording never fails or blocks.
pub trait Metrics: Send + Sync {
    fn attempt(&self, metric: &AttemptMetric);
    /// A delivery reached the failures store for this tenant.
    fn failure(&self, tenant: &TenantId);
    /// Age of the oldest unacknowledged failure (`None`: there is none).
    fn oldest_unacknowledged_failure(&self, age: Option<Duration>);
    /// An outbox item that can never become an event (malformed) was quarantined.
    fn outbox_item_refused(&self) {}
    /// The sweeper queued this many deliveries whose message was lost.
    fn deliveries_swept(&self, _count: u64) {}
    /// The store could not prepare a sweep ([`crate::ports::DeliveryStore::prepare_sweep`]):
    /// the sweep went on with what its index held.
    fn sweep_preparation_failed(&self) {}
    /// This many rows of a producer's PostgreSQL outbox became events.
    fn producer_outbox_drained(&self, _count: u64) {}
    /// A producer's outbox row was moved to quarantine.
    fn producer_outbox_quarantined(&self, _reason: crate::producer_outbox::QuarantineReason) {}
    /// The endpoint was deleted: what is kept per endpoint goes with it.
    fn endpoint_deleted(&self, _tenant: &TenantId, _endpoint: &crate::ids::EndpointId) {}
}

/// Metrics that go nowhere (tools that run handlers outside a runtime).
pub struct NoMetrics;

impl Metrics for NoMetrics {
    fn attempt(&self, _: &AttemptMetric) {}
    fn failure(&self, _: &TenantId) {}
    fn oldest_unacknowledged_failure(&self, _: Option<Duration>) {}
}
