//! What follows a recorded step of the worker: the message requeued for a retry, the
//! failure handler told, the endpoint disabled on `410 Gone`, and what a terminal
//! state implies (repeated when a message comes back after a crash, as each of these
//! is idempotent).

use std::time::Duration;

use crate::delivery::{Delivery, DeliveryState};
use crate::endpoint::{DeliveryMode, Endpoint};
use crate::failure::{FailureNotice, FailureReason};
use crate::ports::{Services, StoreResult};
use crate::state_machine::Action;

use super::health;
use super::task::DeliveryTask;
use super::until;
use super::worker::Disposition;

/// Why an endpoint answered `410 Gone` is disabled (the owner's notice says it).
pub(super) const GONE_REASON: &str = "the receiver answered 410 Gone";

/// Act on the post-write actions: requeue, or hand to the failure handler.
pub(super) async fn carry_out(
    services: &Services,
    task: &DeliveryTask,
    endpoint: &Endpoint,
    delivery: &Delivery,
    actions: &[Action],
) -> StoreResult<Disposition> {
    for action in actions {
        match action {
            Action::RequeueAt(at) => return requeue(services, task, endpoint, *at).await,
            Action::MoveToFailures(notice) => {
                send_failure_notice(services, notice).await?;
                return Ok(Disposition::Done);
            }
            Action::DisableEndpoint => {
                // A human decides whether the URL comes back. What else the step says
                // still follows: an at-most-once delivery's failure notice.
                health::disable(services, endpoint, GONE_REASON, services.clock.now()).await?;
                if delivery.state == DeliveryState::Paused {
                    // Paused for an enable that never comes if the endpoint was not
                    // disabled after all: pointed at a new URL while the attempt ran
                    // (the 410 was the old one's), or deleted. Resumed for the new
                    // URL then, or ended with its endpoint.
                    super::resume::resume_if_enabled(services, delivery).await?;
                }
            }
            Action::RecordAttempt(_) | Action::Send => {}
        }
    }
    settle_terminal(services, delivery, endpoint.mode).await?;
    Ok(Disposition::Done)
}

/// The attempt a resend superseded has ended (its outcome lost to the resend's write,
/// its own record kept): the resend kept this attempt's lease, to wait for it, and a
/// record of it as interrupted, in case it never reported back (see
/// [`crate::state_machine::resend`]). It has: the record goes, and the resend goes at
/// once rather than when the lease runs out, which would hold a "try now" for the
/// whole timeout.
pub(super) async fn release_to_resend(
    services: &Services,
    endpoint: &Endpoint,
    attempted: &Delivery,
) -> StoreResult<()> {
    let Some(current) = services.store.get_delivery(&attempted.id).await? else {
        return Ok(());
    };
    let ours = current.superseded.as_ref().is_some_and(|a| {
        (a.generation, a.number) == (attempted.generation, attempted.attempt_count)
    });
    let waits_for_us = current.state == DeliveryState::Pending
        && current.lease_until.is_some()
        && current.lease_until == attempted.lease_until;
    if !ours && !waits_for_us {
        return Ok(());
    }
    let mut next = current;
    if ours {
        next.superseded = None;
    }
    if waits_for_us {
        next.lease_until = None;
    }
    next.updated_at = services.clock.now();
    match services.store.save_delivery(&next, &[]).await {
        Ok(released) if waits_for_us => {
            // Its own message waits for the lease's end: this one goes now. The later
            // one then finds the attempt under way, or over.
            let task = DeliveryTask::for_delivery(&released);
            let message = task.message(endpoint.max_concurrency, Duration::ZERO);
            services.deliveries.send(vec![message]).await
        }
        Ok(_) => Ok(()),
        // Changed again meanwhile: whoever changed it queued what it needs (and a
        // record left behind is at worst one interrupted attempt too many).
        Err(crate::ports::StoreError::Conflict(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// What follows a terminal state, repeated when a message comes back after a crash
/// (both steps are idempotent): a failure notice for a failed delivery, and for a
/// resend that was delivered, the acknowledgement of the failures it fixed.
pub(super) async fn settle_terminal(
    services: &Services,
    delivery: &Delivery,
    mode: DeliveryMode,
) -> StoreResult<()> {
    match delivery.state {
        DeliveryState::Delivered => super::failures::acknowledge_resolved(services, delivery).await,
        state if state.is_terminal() => resend_failure_notice(services, delivery, mode).await,
        _ => Ok(()),
    }
}

/// Bring the message back at `at`: hidden, for a short wait; sent again delayed (the
/// current one deleted), for a longer one; through the long-delay scheduler beyond
/// the queue's longest delay. A message sent again that arrives before its time (a
/// wait longer than one delay) comes here again and goes on.
pub(super) async fn requeue(
    services: &Services,
    task: &DeliveryTask,
    endpoint: &Endpoint,
    at: chrono::DateTime<chrono::Utc>,
) -> StoreResult<Disposition> {
    let delay = until(at, services.clock.now());
    let limits = services.deliveries.delay_limits();
    if limits.hide.is_none_or(|hide| delay <= hide) {
        return Ok(Disposition::RetryIn(delay));
    }
    match limits.send {
        Some(longest) if delay > longest => {
            services
                .scheduler
                .schedule(task.message(endpoint.max_concurrency, Duration::ZERO), at)
                .await?;
        }
        _ => {
            services
                .deliveries
                .send(vec![task.message(endpoint.max_concurrency, delay)])
                .await?;
        }
    }
    Ok(Disposition::Done)
}

async fn send_failure_notice(services: &Services, notice: &FailureNotice) -> StoreResult<()> {
    let message = crate::ports::OutgoingMessage {
        body: serde_json::to_string(notice).expect("a notice serialises"),
        group: notice.tenant_id.to_string(),
        delay: Duration::ZERO,
        concurrency_key: None,
        concurrency_limit: 0,
    };
    services.failures.send(vec![message]).await
}

async fn resend_failure_notice(
    services: &Services,
    delivery: &Delivery,
    mode: DeliveryMode,
) -> StoreResult<()> {
    let reason = match (delivery.state, mode) {
        (DeliveryState::Exhausted, _) => FailureReason::Exhausted,
        (DeliveryState::Failed, DeliveryMode::AtMostOnce) => FailureReason::AtMostOnce,
        (DeliveryState::Failed, DeliveryMode::AtLeastOnce) => FailureReason::NotRetryable,
        _ => return Ok(()),
    };
    send_failure_notice(
        services,
        &FailureNotice {
            delivery_id: delivery.id.clone(),
            tenant_id: delivery.tenant_id.clone(),
            generation: delivery.generation,
            reason,
            failed_at: delivery.updated_at,
        },
    )
    .await
}
