//! The delivery log in memory: deliveries (written conditionally on their version,
//! with their attempts in the same step), attempts, and failure records.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::delivery::{Attempt, Delivery, DeliveryState};
use crate::event::Event;
use crate::failure::{Acknowledgement, Failure, FailureQuery, Reacknowledge};
use crate::ids::{DeliveryId, EndpointId, FailureId};
use crate::ports::{DeliveryQuery, DeliveryStore, FailureStore, Page, StoreError, StoreResult};

use super::store::{page_desc, MemoryStore};

/// A future that is pending once (asking to be polled again at once), then ready.
struct YieldOnce(bool);

impl std::future::Future for YieldOnce {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// Failure records returned for one delivery at most (as the SQLite store).
const MAX_FAILURES_PER_DELIVERY: usize = 1000;

#[async_trait]
impl DeliveryStore for MemoryStore {
    async fn create_delivery_if_absent(
        &self,
        delivery: &Delivery,
    ) -> StoreResult<(Delivery, bool)> {
        let yields = {
            let probes = &mut self.data().probes;
            probes.creates_under_way += 1;
            probes.most_creates_under_way =
                probes.most_creates_under_way.max(probes.creates_under_way);
            probes.create_yields
        };
        if yields {
            YieldOnce(false).await;
        }
        let mut data = self.data();
        data.probes.creates_under_way -= 1;
        if data.probes.failing_event.as_ref() == Some(&delivery.event_id) {
            return Err(StoreError::Backend("throttled".into()));
        }
        if let Some(stored) = data.deliveries.get(delivery.id.as_str()) {
            return Ok((stored.clone(), false));
        }
        data.deliveries
            .insert(delivery.id.to_string(), delivery.clone());
        data.deliveries_by_event
            .entry((
                delivery.tenant_id.to_string(),
                delivery.event_id.to_string(),
            ))
            .or_default()
            .push(delivery.id.to_string());
        Ok((delivery.clone(), true))
    }

    async fn get_delivery(&self, id: &DeliveryId) -> StoreResult<Option<Delivery>> {
        Ok(self.data().deliveries.get(id.as_str()).cloned())
    }

    async fn save_delivery(
        &self,
        delivery: &Delivery,
        attempts: &[Attempt],
    ) -> StoreResult<Delivery> {
        let mut data = self.data();
        data.append_attempts(attempts);
        let current = data.deliveries.get(delivery.id.as_str());
        if current.is_none_or(|d| d.version != delivery.version) {
            return Err(StoreError::Conflict(format!(
                "delivery {} changed meanwhile",
                delivery.id
            )));
        }
        let mut next = delivery.clone();
        next.version += 1;
        data.deliveries.insert(next.id.to_string(), next.clone());
        Ok(next)
    }

    async fn list_attempts(&self, id: &DeliveryId) -> StoreResult<Vec<Attempt>> {
        let data = self.data();
        let mut attempts: Vec<Attempt> = data
            .attempts_by_delivery
            .get(id.as_str())
            .into_iter()
            .flatten()
            .map(|&at| data.attempts[at].clone())
            .collect();
        attempts.sort_by_key(|a| (a.generation, a.number, a.started_at));
        Ok(attempts)
    }

    async fn list_deliveries(&self, q: &DeliveryQuery) -> StoreResult<Page<Delivery>> {
        let data = self.data();
        let rows = data
            .deliveries
            .iter()
            .map(|(id, d)| (id.clone(), d.clone()));
        Ok(page_desc(rows, q.cursor.as_deref(), q.limit, |d| {
            q.tenant.as_ref().is_none_or(|t| d.tenant_id == *t)
                && q.endpoint_id.as_ref().is_none_or(|e| d.endpoint_id == *e)
                && q.event_type.as_ref().is_none_or(|t| d.event_type == *t)
                && q.status.is_none_or(|s| d.state.status() == s)
                && q.since.is_none_or(|s| d.created_at >= s)
                && q.until.is_none_or(|u| d.created_at < u)
        }))
    }

    async fn deliveries_of_event(&self, event: &Event) -> StoreResult<Vec<Delivery>> {
        let data = self.data();
        let mut found: Vec<Delivery> = data
            .deliveries_by_event
            .get(&(event.tenant_id.to_string(), event.id.to_string()))
            .into_iter()
            .flatten()
            .filter_map(|d| data.deliveries.get(d).cloned())
            .collect();
        found.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        Ok(found)
    }

    async fn endpoint_attempts_since(
        &self,
        endpoint: &EndpointId,
        since: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<Vec<Attempt>> {
        let mut attempts: Vec<Attempt> = self
            .data()
            .attempts
            .iter()
            .filter(|a| a.endpoint_id == *endpoint && a.started_at >= since)
            .cloned()
            .collect();
        attempts.sort_by_key(|a| std::cmp::Reverse(a.started_at));
        attempts.truncate(limit);
        Ok(attempts)
    }

    async fn paused_deliveries(
        &self,
        endpoint: &EndpointId,
        cursor: Option<&str>,
        limit: usize,
    ) -> StoreResult<Page<Delivery>> {
        let data: Vec<Delivery> = self
            .data()
            .deliveries
            .values()
            .filter(|d| d.endpoint_id == *endpoint && d.state == DeliveryState::Paused)
            .filter(|d| cursor.is_none_or(|c| d.id.as_str() > c))
            .take(limit + 1)
            .cloned()
            .collect();
        Ok(Page::from_rows(data, limit, |d| d.id.to_string(), None))
    }

    async fn prepare_sweep(&self, _before: DateTime<Utc>) -> StoreResult<()> {
        if self.data().sweep_preparation_fails {
            return Err(StoreError::Backend("preparing the sweep failed".into()));
        }
        Ok(())
    }

    async fn overdue_deliveries(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<Vec<Delivery>> {
        let mut overdue: Vec<(DateTime<Utc>, Delivery)> = self
            .data()
            .deliveries
            .values()
            .filter_map(|d| {
                d.due_at()
                    .filter(|at| *at < before)
                    .map(|at| (at, d.clone()))
            })
            .collect();
        overdue.sort_by_key(|(at, _)| *at);
        let data = self.data();
        Ok(overdue
            .into_iter()
            .filter(|(_, d)| {
                data.sweep_postponed
                    .get(d.id.as_str())
                    .is_none_or(|(version, until)| *version != d.version || *until < before)
            })
            .take(limit)
            .map(|(_, d)| d)
            .collect())
    }

    async fn postpone_sweep(&self, postponed: &[(Delivery, DateTime<Utc>)]) -> StoreResult<()> {
        let mut data = self.data();
        for (delivery, until) in postponed {
            data.sweep_postponed
                .insert(delivery.id.to_string(), (delivery.version, *until));
        }
        Ok(())
    }
}

#[async_trait]
impl FailureStore for MemoryStore {
    async fn put_failure_if_absent(&self, failure: &Failure) -> StoreResult<bool> {
        let mut data = self.data();
        if data.failures.contains_key(failure.id.as_str()) {
            return Ok(false);
        }
        data.failures
            .insert(failure.id.to_string(), failure.clone());
        data.failures_by_delivery
            .entry(failure.delivery_id.to_string())
            .or_default()
            .insert(failure.id.to_string());
        Ok(true)
    }

    async fn get_failure(&self, id: &FailureId) -> StoreResult<Option<Failure>> {
        Ok(self.data().failures.get(id.as_str()).cloned())
    }

    async fn list_failures(&self, q: &FailureQuery) -> StoreResult<Page<Failure>> {
        let data = self.data();
        let rows = data.failures.iter().map(|(id, f)| (id.clone(), f.clone()));
        Ok(page_desc(rows, q.cursor.as_deref(), q.limit, |f| {
            q.tenant.as_ref().is_none_or(|t| f.tenant_id == *t)
                && q.acknowledged
                    .is_none_or(|ack| f.acknowledged_at.is_some() == ack)
        }))
    }

    async fn oldest_unacknowledged(
        &self,
        limit: usize,
        after: Option<&str>,
    ) -> StoreResult<Page<Failure>> {
        let data: Vec<Failure> = self
            .data()
            .failures
            .iter()
            .filter(|(id, f)| f.acknowledged_at.is_none() && after.is_none_or(|a| id.as_str() > a))
            .take(limit + 1)
            .map(|(_, f)| f.clone())
            .collect();
        Ok(Page::from_rows(data, limit, |f| f.id.to_string(), None))
    }

    async fn failures_of_delivery(&self, delivery: &DeliveryId) -> StoreResult<Vec<Failure>> {
        let data = self.data();
        let ids = data.failures_by_delivery.get(delivery.as_str());
        Ok(ids
            .into_iter()
            .flatten()
            .filter_map(|id| data.failures.get(id))
            .take(MAX_FAILURES_PER_DELIVERY)
            .cloned()
            .collect())
    }

    async fn acknowledge_failure(
        &self,
        id: &FailureId,
        ack: &Acknowledgement,
        again: Reacknowledge,
    ) -> StoreResult<Option<Failure>> {
        let mut data = self.data();
        let Some(stored) = data.failures.get_mut(id.as_str()) else {
            return Ok(None);
        };
        if stored.acknowledged_at.is_none() || again == Reacknowledge::Replace {
            *stored = stored.clone().acknowledged(ack);
        }
        Ok(Some(stored.clone()))
    }
}
