//! Resuming an endpoint that was re-enabled: its paused deliveries are queued again,
//! in the background. Enabling queues a [`ResumeTask`]; the worker takes it like any
//! message and resumes one bounded batch, then queues the task again, with where it
//! stopped, while paused deliveries remain. So an endpoint with a million paused
//! deliveries is enabled in one fast request, no invocation runs past its time, and
//! the endpoint's log is read once, not once per batch.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::delivery::{Delivery, DeliveryState};
use crate::endpoint::Endpoint;
use crate::ids::{EndpointId, TenantId};
use crate::ports::{OutgoingMessage, Services, StoreError, StoreResult};

use super::task::DeliveryTask;

/// Paused deliveries handled per store round trip.
const RESUME_BATCH: usize = 100;
/// Round trips one resume step makes before it hands over to the next message.
const RESUME_BATCHES_PER_STEP: usize = 10;
/// How long after the first pass the closing pass starts. A delivery can be paused
/// just after the enable by a writer that still read the endpoint disabled (the
/// fan-out's endpoint list is an eventually consistent read on AWS, about a second
/// behind); it may sit where the first pass had already looked. The closing pass,
/// from the start, comes late enough to find it.
pub const RESUME_CLOSING_PASS_DELAY: Duration = Duration::from_secs(10);

/// "Resume this endpoint's paused deliveries": a delivery-queue message of its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeTask {
    pub resume_endpoint: EndpointId,
    pub tenant_id: TenantId,
    /// Where the previous step stopped (the store's cursor); absent at the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// Whether this is the closing pass (see [`RESUME_CLOSING_PASS_DELAY`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub closing: bool,
}

impl ResumeTask {
    pub fn message(endpoint: &Endpoint) -> OutgoingMessage {
        Self::message_from(endpoint, None, false, Duration::ZERO)
    }

    fn message_from(
        endpoint: &Endpoint,
        cursor: Option<String>,
        closing: bool,
        delay: Duration,
    ) -> OutgoingMessage {
        Self {
            resume_endpoint: endpoint.id.clone(),
            tenant_id: endpoint.tenant_id.clone(),
            cursor,
            closing,
        }
        .into_message(delay)
    }

    fn into_message(self, delay: Duration) -> OutgoingMessage {
        OutgoingMessage {
            body: serde_json::to_string(&self).expect("a task serialises"),
            group: self.tenant_id.to_string(),
            delay,
            concurrency_key: None,
            concurrency_limit: 0,
        }
    }
}

/// Queue the background resume of a re-enabled endpoint, or the end of a deleted
/// endpoint's paused deliveries (the same task: its step finds the endpoint gone).
pub async fn start_resume(services: &Services, endpoint: &Endpoint) -> StoreResult<()> {
    services
        .deliveries
        .send(vec![ResumeTask::message(endpoint)])
        .await
}

/// One step of a background resume: up to [`RESUME_BATCHES_PER_STEP`] batches, then the
/// task again if paused deliveries remain. Nothing for a disabled endpoint; for a
/// deleted one, its paused deliveries are ended instead.
pub async fn resume_step(services: &Services, task: &ResumeTask) -> StoreResult<usize> {
    let Some(endpoint) = services.store.get_endpoint(&task.resume_endpoint).await? else {
        return end_paused_of_deleted(services, task).await;
    };
    if endpoint.disabled {
        return Ok(0);
    }
    let endpoint = &endpoint;
    let (resumed, left) = walk_paused(services, task, move |page| {
        unpause(services, endpoint, page)
    })
    .await?;
    let next = match left {
        // More may wait: hand over to a fresh message (and, on AWS, a fresh invocation).
        Some(cursor) => {
            ResumeTask::message_from(endpoint, Some(cursor), task.closing, Duration::ZERO)
        }
        None if task.closing => return Ok(resumed),
        // The first pass is through: one more, from the start, a little later.
        None => ResumeTask::message_from(endpoint, None, true, RESUME_CLOSING_PASS_DELAY),
    };
    services.deliveries.send(vec![next]).await?;
    Ok(resumed)
}

/// The endpoint was deleted: its paused deliveries would wait for an enable that can
/// never come, answering "pending" to "did this event arrive?" forever. Each ends as
/// the worker ends a delivery whose endpoint is gone (failed, "the endpoint was
/// deleted"), a bounded step at a time like a resume; how many ended.
async fn end_paused_of_deleted(services: &Services, task: &ResumeTask) -> StoreResult<usize> {
    let (ended, left) = walk_paused(services, task, move |page| async move {
        let mut ended = 0;
        for paused in &page {
            if end_for_deleted_endpoint(services, paused).await? {
                ended += 1;
            }
        }
        Ok(ended)
    })
    .await?;
    if let Some(cursor) = left {
        let next = ResumeTask {
            cursor: Some(cursor),
            ..task.clone()
        };
        services
            .deliveries
            .send(vec![next.into_message(Duration::ZERO)])
            .await?;
    }
    Ok(ended)
}

/// Up to [`RESUME_BATCHES_PER_STEP`] pages of [`RESUME_BATCH`] of the task's endpoint's
/// paused deliveries, from its cursor, each handed to `each_page`: the sum of what it
/// counted, and where the walk stopped (`None`: through to the end).
async fn walk_paused<F, Fut>(
    services: &Services,
    task: &ResumeTask,
    mut each_page: F,
) -> StoreResult<(usize, Option<String>)>
where
    F: FnMut(Vec<Delivery>) -> Fut,
    Fut: std::future::Future<Output = StoreResult<usize>>,
{
    let mut counted = 0;
    let mut cursor = task.cursor.clone();
    for _ in 0..RESUME_BATCHES_PER_STEP {
        let page = services
            .store
            .paused_deliveries(&task.resume_endpoint, cursor.as_deref(), RESUME_BATCH)
            .await?;
        counted += each_page(page.data).await?;
        match page.next_cursor {
            None => return Ok((counted, None)),
            next => cursor = next,
        }
    }
    Ok((counted, cursor))
}

/// End `delivery`, whose endpoint is gone; whether this write did (a delivery changed
/// meanwhile is left as it is now).
async fn end_for_deleted_endpoint(services: &Services, delivery: &Delivery) -> StoreResult<bool> {
    let Some(ended) = crate::state_machine::endpoint_deleted(delivery, services.clock.now()) else {
        return Ok(false);
    };
    let saved = super::worker::save_unless_changed(services, delivery, &ended).await?;
    Ok(saved.is_some())
}

/// A delivery just paused because its endpoint read disabled: read the endpoint again
/// and, if it is enabled by now, resume the delivery at once.
///
/// Why: the read that found the endpoint disabled may be older than an enable (the
/// fan-out's endpoint list is eventually consistent on AWS, the worker's read may have
/// been made with its batch), and that enable's resume may already have looked for
/// paused deliveries before this one was paused. This read comes after the pause
/// landed, so either it sees the enable, or the enable comes after it and its resume
/// finds the delivery paused. Either way nothing stays paused behind an enabled
/// endpoint (the closing pass is then only a second net).
pub async fn resume_if_enabled(services: &Services, paused: &Delivery) -> StoreResult<()> {
    let Some(endpoint) = services.store.get_endpoint(&paused.endpoint_id).await? else {
        // Deleted meanwhile, maybe after its settling pass went by: end it here.
        end_for_deleted_endpoint(services, paused).await?;
        return Ok(());
    };
    if !endpoint.disabled {
        tracing::debug!(delivery_id = %paused.id, "paused on a stale read; the endpoint is enabled: resumed");
        unpause(services, &endpoint, vec![paused.clone()]).await?;
    }
    Ok(())
}

/// Move `paused` deliveries of `endpoint` back to pending and queue each; how many
/// moved (a delivery changed meanwhile is no longer ours to move).
async fn unpause(
    services: &Services,
    endpoint: &Endpoint,
    paused: Vec<Delivery>,
) -> StoreResult<usize> {
    // Mark pending first, then queue. The other order raced with a quick disable: the
    // worker took a message while its delivery still read paused, dropped it for the
    // disabled endpoint, and the resume then wrote "pending" — a pending delivery with
    // no message, which the next enable does not resume (it looks for paused ones).
    // Now the worker always sees "pending" and pauses it again, so the next enable
    // finds it. A crash (or a failed send) in between leaves pending deliveries
    // without a message: the embedded runtime queues them at its next start, and the
    // sweeper (on AWS, and for a failed send) once they are overdue.
    let now = services.clock.now();
    let mut moved = Vec::new();
    for delivery in paused {
        let mut next = delivery;
        next.state = DeliveryState::Pending;
        next.next_attempt_at = Some(now);
        next.updated_at = now;
        match services.store.save_delivery(&next, &[]).await {
            Ok(saved) => moved.push(saved),
            // The worker got there first: it is no longer ours to move.
            Err(StoreError::Conflict(_)) => {}
            Err(e) => return Err(e),
        }
    }
    let messages: Vec<_> = moved
        .iter()
        .map(|d| DeliveryTask::for_delivery(d).message(endpoint.max_concurrency, Duration::ZERO))
        .collect();
    if !messages.is_empty() {
        services.deliveries.send(messages).await?;
    }
    let moved = moved.len();
    if moved > 0 {
        services
            .backlog
            .record(&endpoint.tenant_id, moved as i64)
            .await?;
    }
    Ok(moved)
}

#[cfg(test)]
#[path = "resume_tests.rs"]
mod tests;
