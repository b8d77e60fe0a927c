//! The delivery worker: one queue message in, one attempt (or none) made, the outcome
//! recorded, and a disposition out telling the runtime what to do with the message.

use std::time::Duration;

use tracing::{info_span, Instrument};

use crate::delivery::{Attempt, Delivery, DeliveryState};
use crate::endpoint::{DeliveryMode, Endpoint};
use crate::endpoint_health::SLOW_ATTEMPT;
use crate::outcome::FailureKind;
use crate::ports::{AttemptMetric, PendingWrite, RngOf, Services, StoreError, StoreResult};
use crate::retry::{RetryPolicy, RetrySpec};
use crate::state_machine::{self, Action, AttemptReport, Skip};

use super::attempt_slots::{take_slots, HeldSlots};
pub use super::attempt_slots::{
    SLOTS_BUSY_BACKOFF, SLOTS_BUSY_BACKOFF_MAX, SLOTS_BUSY_RESEND_AFTER,
};
use super::follow_up::{carry_out, release_to_resend, requeue, settle_terminal, GONE_REASON};
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
/// A resend's message seen before the resend wrote its generation: look again this
/// much later (the write follows the send at once).
pub const RESEND_WRITE_RECHECK: Duration = Duration::from_millis(100);

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
    let (delivery, endpoint) = match load(services, task).await? {
        Found::Nothing => {
            tracing::warn!("message for an unknown delivery");
            return Ok(Disposition::Done);
        }
        Found::EndpointDeleted(delivery) => {
            // A resend's message may come before its write, here too.
            let now = services.clock.now();
            if let Some(wait) = before_resend_write(task, &delivery, now) {
                return Ok(wait);
            }
            return ended_unsent(services, &delivery, state_machine::endpoint_deleted).await;
        }
        Found::Both(delivery, endpoint) => (delivery, *endpoint),
    };
    let now = services.clock.now();
    if let Some(disposition) = screen(services, task, &delivery, &endpoint, now).await? {
        return Ok(disposition);
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
        Err(skip) => return skipped(services, task, &delivery, endpoint.mode, skip, now).await,
    };
    let mut attempt = Attempting {
        task,
        endpoint: &endpoint,
        policy: &policy,
        event: None,
        slots: None,
    };
    if !step.sends() {
        return attempt.run(services, &delivery, step).await;
    }
    // Read before anything is written for the attempt: with the event gone, a lease
    // written first ran out unanswered at every receive, and each was recorded as an
    // interrupted attempt until the schedule was used up (a hostile test).
    let Some(event) = services
        .store
        .get_event(&delivery.tenant_id, &delivery.event_id)
        .await?
    else {
        tracing::error!(event_id = %delivery.event_id, "the event of a waiting delivery is gone; the delivery ends failed");
        return ended_unsent(services, &delivery, state_machine::event_gone).await;
    };
    attempt.event = Some(&event);
    // The slot is taken before the "delivering" write: a busy endpoint leaves the
    // delivery as it was, and its message comes back later, instead of holding a
    // delivery lease nobody is using.
    let slots = match take_slots(services, task, &endpoint, &delivery, receive_count, lease).await?
    {
        Ok(slots) => slots,
        Err(busy) => return Ok(busy),
    };
    attempt.slots = Some(&slots);
    let outcome = attempt.run(services, &delivery, step).await;
    slots.release(services).await;
    outcome
}

/// What a message leads to in the store.
enum Found {
    /// No such delivery (a message from a deleted tenant, or a hand-edited store).
    Nothing,
    /// The delivery, whose endpoint its owner deleted.
    EndpointDeleted(Delivery),
    Both(Delivery, Box<Endpoint>),
}

async fn load(services: &Services, task: &DeliveryTask) -> StoreResult<Found> {
    let Some(delivery) = services.store.get_delivery(&task.delivery_id).await? else {
        return Ok(Found::Nothing);
    };
    Ok(
        match services.store.get_endpoint(&delivery.endpoint_id).await? {
            Some(endpoint) => Found::Both(delivery, Box::new(endpoint)),
            None => Found::EndpointDeleted(delivery),
        },
    )
}

/// What settles a message before the state machine is asked: a message from a
/// resend not yet written, a disabled endpoint, a retry that is not yet due.
async fn screen(
    services: &Services,
    task: &DeliveryTask,
    delivery: &Delivery,
    endpoint: &Endpoint,
    now: chrono::DateTime<chrono::Utc>,
) -> StoreResult<Option<Disposition>> {
    if let Some(wait) = before_resend_write(task, delivery, now) {
        return Ok(Some(wait));
    }
    if lost_its_resend_race(task, delivery) {
        tracing::debug!("a message of a resend that lost its race to another; dropped");
        return Ok(Some(Disposition::Done));
    }
    if endpoint.disabled {
        if !delivery.state.is_terminal() && delivery.state != DeliveryState::Paused {
            let paused = state_machine::pause(delivery, now);
            if let Some(paused) = save_unless_changed(services, delivery, &paused).await? {
                super::resume::resume_if_enabled(services, &paused).await?;
            }
        }
        return Ok(Some(Disposition::Done));
    }
    if delivery.state == DeliveryState::Retrying && task.generation == delivery.generation {
        if let Some(at) = delivery.next_attempt_at.filter(|at| *at > now) {
            // Early: a duplicate message, or one whose requeue was lost in a crash.
            return requeue(services, task, endpoint, at).await.map(Some);
        }
    }
    Ok(None)
}

/// A message from a resend that queued it before writing its generation: wait for the
/// write, but not forever (the resend may have died between the two). A message from
/// before `resent_at_ms` existed counts from the delivery's last change. `None`: the
/// message is not ahead of its write.
fn before_resend_write(
    task: &DeliveryTask,
    delivery: &Delivery,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<Disposition> {
    if task.generation <= delivery.generation {
        return None;
    }
    let queued = task
        .resent_at_ms
        .and_then(chrono::DateTime::from_timestamp_millis)
        .unwrap_or(delivery.updated_at);
    if now - queued < super::resend::FUTURE_GENERATION_GRACE {
        // The write is normally a moment behind: look again soon, so "try now" is not
        // two seconds late (SQS rounds this up to its one second).
        return Some(Disposition::RetryIn(RESEND_WRITE_RECHECK));
    }
    Some(Disposition::Done)
}

/// Whether `task` was queued by a resend whose write lost to another resend of the
/// same generation: it names that generation, but another resend's token. Sent, it
/// went beside the winner's own message, the event on the wire twice at once (a
/// hostile test: three resends at one moment).
fn lost_its_resend_race(task: &DeliveryTask, delivery: &Delivery) -> bool {
    task.generation == delivery.generation
        && task.resend_token.is_some()
        && task.resend_token != delivery.resend_token
}

/// No attempt for this message: why decides what becomes of it.
async fn skipped(
    services: &Services,
    task: &DeliveryTask,
    delivery: &Delivery,
    mode: DeliveryMode,
    skip: Skip,
    now: chrono::DateTime<chrono::Utc>,
) -> StoreResult<Disposition> {
    match skip {
        Skip::Busy(at) => Ok(Disposition::RetryIn(until(at, now))),
        Skip::Terminal if task.generation == delivery.generation => {
            // A crash may have come between the terminal write and what follows it
            // (a failure notice, an acknowledgement): do it again.
            settle_terminal(services, delivery, mode).await?;
            Ok(Disposition::Done)
        }
        skip => {
            tracing::debug!(?skip, "no attempt");
            Ok(Disposition::Done)
        }
    }
}

/// A step `begin` decided, for one message at one endpoint under its policy.
struct Attempting<'a> {
    task: &'a DeliveryTask,
    endpoint: &'a Endpoint,
    policy: &'a RetryPolicy,
    /// The event its request carries, read before the step was written.
    event: Option<&'a crate::event::Event>,
    /// The slots its request holds, given back once the response is in.
    slots: Option<&'a HeldSlots>,
}

impl Attempting<'_> {
    /// Record the step; when it sends, send, then record the outcome and act on it.
    async fn run(
        &self,
        services: &Services,
        read: &Delivery,
        step: state_machine::Step,
    ) -> StoreResult<Disposition> {
        let attempts = step.attempts();
        if !step.sends() {
            let delivery = match services
                .store
                .save_delivery(&step.delivery, &attempts)
                .await
            {
                Ok(saved) => saved,
                Err(StoreError::Conflict(_)) => return Ok(Disposition::RetryIn(CONFLICT_BACKOFF)),
                Err(e) => return Err(e),
            };
            left_waiting(services, read.state, &delivery).await?;
            return carry_out(services, self.task, self.endpoint, &delivery, &step.actions).await;
        }
        let lease = match self.write_lease(services, &step.delivery, &attempts).await {
            Ok(lease) => lease,
            Err(StoreError::Conflict(_)) => return Ok(Disposition::RetryIn(CONFLICT_BACKOFF)),
            Err(e) => return Err(e),
        };
        let report = self.send(services, &step.delivery).await?;
        let (delivery, unrecorded) = match lease.await {
            Ok(saved) => (saved, Vec::new()),
            Err(e) => {
                // The lease never landed: the delivery changed first (a resend, a
                // pause, a duplicate's lease), or the store failed. The outcome is then
                // written against the version read, so it lands only if nobody changed
                // the delivery; if somebody did, it is a conflict like any other: the
                // attempt is kept, the delivery is left as they made it. The lease's
                // own records (an interrupted attempt) go with it: a store that failed
                // did not keep them.
                tracing::debug!(error = %e, "the lease written ahead of the attempt did not land");
                (step.delivery.clone(), attempts)
            }
        };
        let now = services.clock.now();
        let step = state_machine::complete(
            &delivery,
            &report,
            self.endpoint.mode,
            self.policy,
            now,
            &mut RngOf(services.random.as_ref()),
        );
        tracing::info!(
            attempt = step.delivery.attempt_count,
            status = ?report.result.status(),
            state = ?step.delivery.state,
            duration_ms = report.duration.as_millis() as u64,
            "attempt finished"
        );
        self.record_outcome(services, &delivery, &report, step, unrecorded, now)
            .await
    }

    /// Write the lease `begun` before the request is sent. At most once, this write
    /// is the guarantee, so it is on disk before the request goes. At least once, it
    /// is what keeps a duplicate message (a replayed fan-out, a sweep, SQS's own) from
    /// sending the same delivery again while this attempt runs (the other worker finds
    /// the lease, `Skip::Busy`, and after it the outcome); a store may let the request
    /// go while it commits (see `save_delivery_ahead`), as a duplicate send in that
    /// moment is within the promise.
    async fn write_lease(
        &self,
        services: &Services,
        begun: &Delivery,
        attempts: &[Attempt],
    ) -> StoreResult<PendingWrite<Delivery>> {
        if self.endpoint.mode == DeliveryMode::AtLeastOnce {
            return services.store.save_delivery_ahead(begun, attempts).await;
        }
        let saved = services.store.save_delivery(begun, attempts).await?;
        Ok(crate::ports::written(saved))
    }

    /// Sign and send the request for `delivery`; what came of it.
    async fn send(&self, services: &Services, delivery: &Delivery) -> StoreResult<AttemptReport> {
        let event = self.event.ok_or_else(|| {
            StoreError::Backend(format!(
                "event {} of a delivery was not read",
                delivery.event_id
            ))
        })?;
        let request = signed_request(self.endpoint, event, services.clock.now());
        let started_at = services.clock.now();
        let result = services.transport.send(&request).await;
        // Measured on the clock port, as every time here: under a simulated clock an
        // attempt takes the virtual time the receiver took.
        let duration = (services.clock.now() - started_at)
            .to_std()
            .unwrap_or_default();
        if let Some(slots) = self.slots {
            slots.release(services).await;
        }
        let report = AttemptReport {
            started_at,
            duration,
            result,
        };
        record_metrics(services, delivery, event, &report, services.clock.now());
        Ok(report)
    }

    /// Persist the attempt's outcome (with `attempts` not yet recorded), then the
    /// endpoint's health and what the step asks for next.
    async fn record_outcome(
        &self,
        services: &Services,
        delivery: &Delivery,
        report: &AttemptReport,
        step: state_machine::Step,
        mut attempts: Vec<Attempt>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> StoreResult<Disposition> {
        attempts.extend(step.attempts());
        let succeeded = report.result.failure_kind().is_none();
        let slow = report.duration >= SLOW_ATTEMPT
            || report.result.failure_kind() == Some(FailureKind::Timeout);
        let saved = match services
            .store
            .save_delivery(&step.delivery, &attempts)
            .await
        {
            Ok(saved) => saved,
            Err(StoreError::Conflict(_)) => {
                // Only a resend changes a delivery under a running attempt. The attempt
                // still happened, and the store kept its record (under its own
                // generation); the resend, waiting for this attempt, goes now. The
                // attempt's verdict on the endpoint stands: after a 410 the resend
                // finds it disabled and waits (it went straight to the Gone URL).
                if step.actions.contains(&Action::DisableEndpoint) {
                    health::disable(services, self.endpoint, GONE_REASON, now).await?;
                } else {
                    health::observe(services, self.endpoint, succeeded, slow, now).await?;
                }
                release_to_resend(services, self.endpoint, delivery).await?;
                return Ok(Disposition::Done);
            }
            Err(e) => return Err(e),
        };
        left_waiting(services, delivery.state, &saved).await?;
        if !step.actions.contains(&Action::DisableEndpoint) {
            health::observe(services, self.endpoint, succeeded, slow, now).await?;
        }
        carry_out(services, self.task, self.endpoint, &saved, &step.actions).await
    }
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

/// The endpoint was deleted by its owner, or the event is gone: the state machine
/// (`end`) ends the delivery unsent.
///
/// A concurrent change keeps the message: it may be a resend that wrote its generation
/// after this read and whose own message this is. Dropped, that resend's delivery
/// stayed pending with nothing queued; kept, it comes back and is ended on a fresh read.
async fn ended_unsent(
    services: &Services,
    delivery: &Delivery,
    end: fn(&Delivery, chrono::DateTime<chrono::Utc>) -> Option<Delivery>,
) -> StoreResult<Disposition> {
    if let Some(next) = end(delivery, services.clock.now()) {
        if save_unless_changed(services, delivery, &next)
            .await?
            .is_none()
        {
            return Ok(Disposition::RetryIn(CONFLICT_BACKOFF));
        }
    }
    Ok(Disposition::Done)
}

/// Save `next` (read as `before`), a transition that records no attempt; a
/// concurrent change wins and is left alone (`None`).
pub(super) async fn save_unless_changed(
    services: &Services,
    before: &Delivery,
    next: &Delivery,
) -> StoreResult<Option<Delivery>> {
    match services.store.save_delivery(next, &[]).await {
        Ok(saved) => {
            left_waiting(services, before.state, &saved).await?;
            Ok(Some(saved))
        }
        Err(StoreError::Conflict(_)) => Ok(None),
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

#[cfg(test)]
#[path = "worker_tests.rs"]
mod tests;
