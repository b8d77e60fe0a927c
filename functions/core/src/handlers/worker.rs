//! The delivery worker: one queue message in, one attempt (or none) made, the outcome
//! recorded, and a disposition out telling the runtime what to do with the message.

use std::time::{Duration, Instant};

use rand::SeedableRng;
use tracing::{info_span, Instrument};

use crate::delivery::{Delivery, DeliveryState};
use crate::endpoint::{DeliveryMode, Endpoint};
use crate::failure::{FailureNotice, FailureReason};
use crate::ports::{AttemptMetric, Services, StoreError, StoreResult};
use crate::retry::{RetryPolicy, RetrySpec};
use crate::state_machine::{self, Action, AttemptReport, Skip};

use super::health;
use super::resume::{resume_step, ResumeTask};
use super::task::DeliveryTask;
use super::until;
use super::webhook::signed_request;

/// How long past its timeout an attempt may run before another worker presumes the
/// one that started it dead. Covers connection set-up and the write of the outcome.
pub const LEASE_MARGIN: Duration = Duration::from_secs(5);
/// When a concurrent write beat ours, look at the delivery again this much later.
pub const CONFLICT_BACKOFF: Duration = Duration::from_secs(2);
/// Every slot of the endpoint is taken: the message is hidden for this on its first
/// receive, doubling per receive ([`super::backoff`]). The slots free up as attempts
/// finish; the doubling keeps a deep backlog behind one slow endpoint from asking for
/// slots many times a second (every ask is a conditional write on AWS).
pub const SLOTS_BUSY_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait for a slot. Under a minute, so the wait is a visibility change
/// and a message comes back soon after its endpoint recovers.
pub const SLOTS_BUSY_BACKOFF_MAX: Duration = Duration::from_secs(50);
/// Receives of one message spent waiting for a slot before it is sent again instead
/// (delayed, the received copy deleted): every receive counts towards the queue's
/// redrive limit (100), and a long wait for a busy endpoint is not a poison message.
pub const SLOTS_BUSY_RESEND_AFTER: u32 = 20;

/// What the runtime does with the message after the handler ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Delete it: nothing more will come of it.
    Done,
    /// Keep it, hidden for this long (SQS: ChangeMessageVisibility + report it failed).
    RetryIn(Duration),
}

/// Handle one delivery-queue message, received for the `receive_count`th time. `Err`
/// means a backend failed: leave the message alone and it comes back after its
/// visibility timeout.
pub async fn handle_delivery(
    services: &Services,
    body: &str,
    receive_count: u32,
) -> StoreResult<Disposition> {
    let task: DeliveryTask = match serde_json::from_str(body) {
        Ok(task) => task,
        Err(_) if let Ok(resume) = serde_json::from_str::<ResumeTask>(body) => {
            let span = info_span!("resume", endpoint_id = %resume.resume_endpoint);
            let resumed = resume_step(services, &resume).instrument(span).await?;
            tracing::info!(endpoint_id = %resume.resume_endpoint, resumed, "paused deliveries resumed");
            return Ok(Disposition::Done);
        }
        Err(e) => {
            // Not ours to interpret; keeping it would only redeliver it forever.
            tracing::error!(error = %e, "dropping an unreadable delivery message");
            return Ok(Disposition::Done);
        }
    };
    let span = info_span!(
        "deliver",
        delivery_id = %task.delivery_id,
        endpoint_id = %task.endpoint_id,
        tenant_id = %task.tenant_id,
        generation = task.generation
    );
    deliver(services, &task, receive_count)
        .instrument(span)
        .await
}

async fn deliver(
    services: &Services,
    task: &DeliveryTask,
    receive_count: u32,
) -> StoreResult<Disposition> {
    let store = &services.store;
    let Some(delivery) = store.get_delivery(&task.delivery_id).await? else {
        tracing::warn!("message for an unknown delivery");
        return Ok(Disposition::Done);
    };
    let Some(endpoint) = store.get_endpoint(&delivery.endpoint_id).await? else {
        return endpoint_gone(services, &delivery).await;
    };
    let now = services.clock.now();
    if task.generation > delivery.generation {
        // A resend queued this before writing its generation: wait for the write, but
        // not forever (the resend may have died between the two).
        if now - delivery.updated_at < super::resend::FUTURE_GENERATION_GRACE {
            return Ok(Disposition::RetryIn(CONFLICT_BACKOFF));
        }
        return Ok(Disposition::Done);
    }
    if endpoint.disabled {
        if !delivery.state.is_terminal() && delivery.state != DeliveryState::Paused {
            save_or_backoff(
                services,
                &delivery,
                &state_machine::pause(&delivery, now),
                &[],
            )
            .await?;
        }
        return Ok(Disposition::Done);
    }
    if delivery.state == DeliveryState::Retrying && task.generation == delivery.generation {
        if let Some(at) = delivery.next_attempt_at.filter(|at| *at > now) {
            // Early: a duplicate message, or one whose requeue was lost in a crash.
            return requeue(services, task, &endpoint, at).await;
        }
    }
    let policy = policy_of(&endpoint);
    let lease = Duration::from_millis(u64::from(endpoint.timeout_ms)) + LEASE_MARGIN;
    let step = match state_machine::begin(
        &delivery,
        task.generation,
        endpoint.mode,
        &policy,
        lease,
        now,
    ) {
        Ok(step) => step,
        Err(Skip::Busy(at)) => return Ok(Disposition::RetryIn(until(at, now))),
        Err(Skip::Terminal) if task.generation == delivery.generation => {
            // A crash may have come between the terminal write and what follows it
            // (a failure notice, an acknowledgement): do it again.
            settle_terminal(services, &delivery, endpoint.mode).await?;
            return Ok(Disposition::Done);
        }
        Err(skip) => {
            tracing::debug!(?skip, "no attempt");
            return Ok(Disposition::Done);
        }
    };
    if !split_actions(&step).1 {
        return run_step(services, task, &endpoint, &delivery, step, &policy).await;
    }
    // The slot is taken before the "delivering" write: a busy endpoint leaves the
    // delivery as it was, and its message comes back later, instead of holding a
    // delivery lease nobody is using.
    // Unique per ask: a duplicate message's attempt must not release this one's slot,
    // and a store that retries a write it already applied recognises it as ours.
    let holder = format!(
        "{}#{}#{}#{:016x}",
        delivery.id,
        delivery.generation,
        delivery.attempt_count,
        rand::random::<u64>()
    );
    let Some(slot) = services
        .slots
        .acquire(&endpoint.id, endpoint.max_concurrency, &holder, now, lease)
        .await?
    else {
        tracing::debug!("every slot of the endpoint is taken");
        let wait = super::backoff(receive_count, SLOTS_BUSY_BACKOFF, SLOTS_BUSY_BACKOFF_MAX);
        if receive_count >= SLOTS_BUSY_RESEND_AFTER {
            let fresh = task.message(endpoint.max_concurrency, wait);
            services.deliveries.send(vec![fresh]).await?;
            return Ok(Disposition::Done);
        }
        return Ok(Disposition::RetryIn(wait));
    };
    let outcome = run_step(services, task, &endpoint, &delivery, step, &policy).await;
    if let Err(e) = services.slots.release(&slot).await {
        // The slot frees itself when its lease ends; only that much capacity is lost.
        tracing::warn!(error = %e, "could not release the endpoint slot");
    }
    outcome
}

/// Carry out a step that `begin` decided: record it, and when it sends, send and
/// record the outcome.
async fn run_step(
    services: &Services,
    task: &DeliveryTask,
    endpoint: &Endpoint,
    delivery: &Delivery,
    step: state_machine::Step,
    policy: &RetryPolicy,
) -> StoreResult<Disposition> {
    let store = &services.store;
    let (attempts, sends) = split_actions(&step);
    let read_state = delivery.state;
    // Persisted *before* sending. At most once, this write is the guarantee; at least
    // once, it is what keeps a duplicate message (a replayed fan-out, a sweep, SQS's
    // own) from sending the same delivery again while this attempt runs: the other
    // worker finds the lease (`Skip::Busy`) and, after it, the outcome.
    let delivery = match store.save_delivery(&step.delivery, &attempts).await {
        Ok(saved) => saved,
        Err(StoreError::Conflict(_)) => return Ok(Disposition::RetryIn(CONFLICT_BACKOFF)),
        Err(e) => return Err(e),
    };
    if !sends {
        left_waiting(services, read_state, &delivery).await?;
        return carry_out(services, task, endpoint, &delivery, &step.actions).await;
    }
    let event = store
        .get_event(&delivery.tenant_id, &delivery.event_id)
        .await?
        .ok_or_else(|| {
            StoreError::Backend(format!(
                "event {} of a delivery is missing",
                delivery.event_id
            ))
        })?;
    let request = signed_request(endpoint, &event, services.clock.now());
    let started_at = services.clock.now();
    let started = Instant::now();
    let result = services.transport.send(&request).await;
    let report = AttemptReport {
        started_at,
        duration: started.elapsed(),
        result,
    };
    let mut rng = rand::rngs::StdRng::from_entropy();
    let step = state_machine::complete(
        &delivery,
        &report,
        endpoint.mode,
        policy,
        services.clock.now(),
        &mut rng,
    );
    tracing::info!(
        attempt = step.delivery.attempt_count,
        status = ?report.result.status(),
        state = ?step.delivery.state,
        duration_ms = report.duration.as_millis() as u64,
        "attempt finished"
    );
    let now = services.clock.now();
    record_metrics(services, &delivery, &event, &report, now);
    let gone = report.result.status() == Some(GONE);
    let step = if gone { keep_paused(step, now) } else { step };
    let (attempts, _) = split_actions(&step);
    let succeeded = report.result.failure_kind().is_none();
    let saved = match store.save_delivery(&step.delivery, &attempts).await {
        Ok(saved) => saved,
        Err(StoreError::Conflict(_)) => {
            // Only a resend changes a delivery under a running attempt. The attempt
            // still happened, so its record is kept (under its own generation); the
            // resend queued its own message, so this one has nothing left to do.
            store.append_attempts(&attempts).await?;
            health::observe(services, endpoint, succeeded, now).await?;
            return Ok(Disposition::Done);
        }
        Err(e) => return Err(e),
    };
    left_waiting(services, delivery.state, &saved).await?;
    if gone {
        // The receiver says the URL is gone for good: stop sending to it, keep what is
        // waiting (paused), and let a human decide.
        health::disable(services, endpoint, "the receiver answered 410 Gone", now).await?;
        return Ok(Disposition::Done);
    }
    health::observe(services, endpoint, succeeded, now).await?;
    carry_out(services, task, endpoint, &saved, &step.actions).await
}

/// `410 Gone`: the endpoint is retired, not failing.
const GONE: u16 = 410;

/// The attempt is recorded, but the delivery waits (paused) instead of retrying or
/// failing: re-enabling the endpoint sends it.
fn keep_paused(
    step: state_machine::Step,
    now: chrono::DateTime<chrono::Utc>,
) -> state_machine::Step {
    let delivery = state_machine::pause(&step.delivery, now);
    let actions = step
        .actions
        .into_iter()
        .filter(|a| matches!(a, Action::RecordAttempt(_)))
        .collect();
    state_machine::Step { delivery, actions }
}

fn record_metrics(
    services: &Services,
    delivery: &Delivery,
    event: &crate::event::Event,
    report: &AttemptReport,
    now: chrono::DateTime<chrono::Utc>,
) {
    let failure = report.result.failure_kind();
    services.metrics.attempt(&AttemptMetric {
        tenant_id: delivery.tenant_id.clone(),
        endpoint_id: delivery.endpoint_id.clone(),
        failure,
        response_ms: report.duration.as_millis() as u64,
        delivery_latency_ms: failure
            .is_none()
            .then(|| (now - event.created_at).num_milliseconds().max(0) as u64),
    });
}

/// The attempts to append with the step's delivery, and whether to send.
fn split_actions(step: &state_machine::Step) -> (Vec<crate::delivery::Attempt>, bool) {
    let mut attempts = Vec::new();
    let mut sends = false;
    for action in &step.actions {
        match action {
            Action::RecordAttempt(a) => attempts.push(a.clone()),
            Action::Send => sends = true,
            Action::RequeueAt(_) | Action::MoveToFailures(_) => {}
        }
    }
    (attempts, sends)
}

/// Act on the post-write actions: requeue, or hand to the failure handler.
async fn carry_out(
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
            Action::RecordAttempt(_) | Action::Send => {}
        }
    }
    settle_terminal(services, delivery, endpoint.mode).await?;
    Ok(Disposition::Done)
}

/// What follows a terminal state, repeated when a message comes back after a crash
/// (both steps are idempotent): a failure notice for a failed delivery, and for a
/// resend that was delivered, the acknowledgement of the failures it fixed.
async fn settle_terminal(
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
async fn requeue(
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

/// The endpoint was deleted by its owner: the delivery ends as failed, on purpose,
/// without alerting anyone (nobody is left to receive it).
async fn endpoint_gone(services: &Services, delivery: &Delivery) -> StoreResult<Disposition> {
    if !delivery.state.is_terminal() {
        let mut next = delivery.clone();
        next.state = DeliveryState::Failed;
        next.last_error = Some("the endpoint was deleted".into());
        next.next_attempt_at = None;
        next.updated_at = services.clock.now();
        save_or_backoff(services, delivery, &next, &[]).await?;
    }
    Ok(Disposition::Done)
}

/// Save `next` (read as `before`); a concurrent change wins and is left alone.
async fn save_or_backoff(
    services: &Services,
    before: &Delivery,
    next: &Delivery,
    attempts: &[crate::delivery::Attempt],
) -> StoreResult<()> {
    match services.store.save_delivery(next, attempts).await {
        Ok(saved) => left_waiting(services, before.state, &saved).await,
        Err(StoreError::Conflict(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// A saved transition out of the waiting set (delivered, failed, exhausted, paused)
/// takes one off the tenant's backlog.
async fn left_waiting(
    services: &Services,
    before: DeliveryState,
    after: &Delivery,
) -> StoreResult<()> {
    if before.is_waiting() && !after.state.is_waiting() {
        services.backlog.record(&after.tenant_id, -1).await?;
    }
    Ok(())
}

/// The endpoint's policy. Specs are validated when written, so the fallback is only
/// for a record edited by hand.
pub fn policy_of(endpoint: &Endpoint) -> RetryPolicy {
    endpoint.retry.policy().unwrap_or_else(|_| {
        RetrySpec::default()
            .policy()
            .expect("the default preset is valid")
    })
}
