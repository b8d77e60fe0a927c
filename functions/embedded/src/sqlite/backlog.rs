//! Each tenant's waiting work, counted in memory from what this process owns: events
//! committed but not fanned out, and messages in the delivery queue. Exact, because
//! only one process may open the database; rebuilt from the file at start-up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use entrega_core::ids::TenantId;
use entrega_core::ports::{Backlog, StoreResult};

use super::queue::SqliteQueue;
use super::SqliteStore;

/// Counts per tenant; cheap to clone (shared).
#[derive(Clone, Default)]
pub struct TenantCounts(Arc<Mutex<HashMap<String, u64>>>);

impl TenantCounts {
    pub fn add(&self, tenant: &TenantId, delta: i64) {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let count = counts.entry(tenant.to_string()).or_default();
        *count = count.saturating_add_signed(delta);
        if *count == 0 {
            counts.remove(tenant.as_str());
        }
    }

    pub fn set(&self, tenant: String, count: u64) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(tenant, count);
    }

    pub fn get(&self, tenant: &str) -> u64 {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(tenant)
            .copied()
            .unwrap_or(0)
    }

    /// Every tenant's count, for `/metrics`.
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        let counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        counts.iter().map(|(t, n)| (t.clone(), *n)).collect()
    }
}

/// The embedded runtime's [`Backlog`]: outbox rows not fanned out plus queued
/// delivery messages (queued, retrying, in flight) of the tenant.
#[derive(Clone)]
pub struct EmbeddedBacklog {
    pub store: SqliteStore,
    pub deliveries: SqliteQueue,
}

impl EmbeddedBacklog {
    pub fn tenant(&self, tenant: &str) -> u64 {
        self.store.outbox_pending.get(tenant) + self.deliveries.group_len(tenant)
    }

    /// Every tenant with waiting work, for `/metrics`.
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        let mut all: HashMap<String, u64> =
            self.store.outbox_pending.snapshot().into_iter().collect();
        for (tenant, n) in self.deliveries.group_lens() {
            *all.entry(tenant).or_default() += n;
        }
        all.into_iter().collect()
    }
}

#[async_trait]
impl Backlog for EmbeddedBacklog {
    async fn tenant_backlog(&self, tenant: &TenantId) -> StoreResult<u64> {
        Ok(self.tenant(tenant.as_str()))
    }

    /// Derived from the queues: the handlers' bookkeeping is not needed here.
    async fn record(&self, _: &TenantId, _: i64) -> StoreResult<()> {
        Ok(())
    }
}
