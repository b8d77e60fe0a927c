//! The delivery state machine: pure functions from (delivery, outcome, policy, now,
//! randomness) to the next delivery state and the actions the runtime must carry out.
//!
//! The order is fixed on purpose: [`begin`] marks the delivery `Delivering` and the
//! runtime persists that *before* sending. That write is what lets a restarted worker
//! tell "never attempted" from "attempted, outcome unknown", which is the whole
//! difference between at-least-once (send again) and at-most-once (never send twice).

use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;

use crate::delivery::{
    truncate_utf8, Attempt, Delivery, DeliveryState, Trigger, RESPONSE_EXCERPT_BYTES,
};
use crate::endpoint::DeliveryMode;
use crate::failure::{FailureNotice, FailureReason};
use crate::ids::AttemptId;
use crate::outcome::{FailureKind, TransportResult};
use crate::retry::RetryPolicy;
use crate::retry_after::parse_retry_after;

/// What the runtime must do after persisting the step's delivery.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Append this attempt to the delivery log.
    RecordAttempt(Attempt),
    /// Send the request now (the delivery is persisted as `Delivering` first).
    Send,
    /// Make the delivery's message visible again at this time.
    RequeueAt(DateTime<Utc>),
    /// Hand the delivery to the failure handler.
    MoveToFailures(FailureNotice),
    /// The receiver answered `410 Gone`: disable the endpoint (the delivery waits,
    /// paused, for a human to re-enable it).
    DisableEndpoint,
}

impl Step {
    /// Whether the step sends a request (after its delivery is persisted).
    pub fn sends(&self) -> bool {
        self.actions.iter().any(|a| matches!(a, Action::Send))
    }

    /// The attempts the step appends to the log, with its delivery.
    pub fn attempts(&self) -> Vec<Attempt> {
        self.actions
            .iter()
            .filter_map(|a| match a {
                Action::RecordAttempt(attempt) => Some(attempt.clone()),
                _ => None,
            })
            .collect()
    }
}

/// The next state of a delivery and what to do about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub delivery: Delivery,
    pub actions: Vec<Action>,
}

/// Why a queue message leads to no attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Delivered, failed or exhausted: only a resend starts it again.
    Terminal,
    /// The message belongs to an earlier generation (a resend has superseded it).
    StaleGeneration,
    /// Another worker's attempt may still be running until this time.
    Busy(DateTime<Utc>),
}

/// What one finished attempt looked like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptReport {
    pub started_at: DateTime<Utc>,
    pub duration: Duration,
    pub result: TransportResult,
}

const INTERRUPTED_ERROR: &str = "interrupted: the worker stopped before the outcome was known";

/// Decide whether the message for `delivery` (of `generation`) starts an attempt.
/// `lease` is how long the attempt may take before another worker may presume it dead.
pub fn begin(
    delivery: &Delivery,
    generation: u32,
    mode: DeliveryMode,
    policy: &RetryPolicy,
    lease: Duration,
    now: DateTime<Utc>,
) -> Result<Step, Skip> {
    if generation < delivery.generation {
        return Err(Skip::StaleGeneration);
    }
    if delivery.state.is_terminal() {
        return Err(Skip::Terminal);
    }
    // Under way: an attempt, or (a resend made meanwhile) the attempt it superseded.
    if let Some(until) = delivery.lease_until.filter(|until| *until > now) {
        return Err(Skip::Busy(until));
    }
    let mut next = delivery.clone();
    let mut actions = Vec::new();
    // The superseded attempt's worker never reported back: it may have sent.
    if let Some(superseded) = next.superseded.take() {
        actions.push(Action::RecordAttempt(*superseded));
    }
    if delivery.state == DeliveryState::Delivering {
        // The worker that started this attempt died: its outcome is unknown.
        actions.push(Action::RecordAttempt(interrupted_attempt(delivery)));
        next.last_error = Some(INTERRUPTED_ERROR.to_owned());
        next.last_status_code = None;
        let reason = match mode {
            DeliveryMode::AtMostOnce => Some(FailureReason::AtMostOnce),
            DeliveryMode::AtLeastOnce if delivery.attempt_count >= policy.max_attempts() => {
                Some(FailureReason::Exhausted)
            }
            DeliveryMode::AtLeastOnce => None,
        };
        if let Some(reason) = reason {
            return Ok(give_up(next, actions, reason, now));
        }
    } else if mode == DeliveryMode::AtMostOnce && delivery.attempt_count > 0 {
        // Sent before and still waiting: tried at least once before its endpoint was
        // switched to at most once, or resumed with its one attempt made. Another send
        // would break the promise, and skipping it (as before) left it waiting for
        // good, never sent nor failed. It ends here, on the failures list, where a
        // person sees it and can resend it.
        return Ok(give_up(next, actions, FailureReason::AtMostOnce, now));
    }
    next.state = DeliveryState::Delivering;
    next.attempt_count += 1;
    next.lease_until = Some(now + lease);
    next.next_attempt_at = None;
    next.updated_at = now;
    actions.push(Action::Send);
    Ok(Step {
        delivery: next,
        actions,
    })
}

/// The state after the attempt `begin` started has finished.
pub fn complete<R: Rng + ?Sized>(
    delivery: &Delivery,
    report: &AttemptReport,
    mode: DeliveryMode,
    policy: &RetryPolicy,
    now: DateTime<Utc>,
    rng: &mut R,
) -> Step {
    let mut next = delivery.clone();
    next.lease_until = None;
    next.updated_at = now;
    next.last_status_code = report.result.status();
    let kind = report.result.failure_kind();
    let attempt = attempt_from_report(delivery, report, kind);
    next.last_error = attempt.error.clone();
    let mut actions = vec![Action::RecordAttempt(attempt)];

    if report.result.status() == Some(GONE) {
        actions.push(Action::DisableEndpoint);
        if mode == DeliveryMode::AtMostOnce {
            // Sent once already, so re-enabling must not send it again: it ends here,
            // on the failures list, where a person sees it, rather than paused until
            // an enable that could only fail it.
            return give_up(next, actions, FailureReason::AtMostOnce, now);
        }
        // The receiver says the URL is gone for good, which is no failure of this
        // delivery: it waits, paused, and the endpoint is disabled for a human to
        // decide (re-enabling sends it).
        next.state = DeliveryState::Paused;
        next.next_attempt_at = None;
        return Step {
            delivery: next,
            actions,
        };
    }
    let Some(kind) = kind else {
        next.state = DeliveryState::Delivered;
        next.delivered_at = Some(now);
        next.next_attempt_at = None;
        return Step {
            delivery: next,
            actions,
        };
    };
    if mode == DeliveryMode::AtMostOnce {
        return give_up(next, actions, FailureReason::AtMostOnce, now);
    }
    if !policy.is_retryable(kind, report.result.status()) {
        return give_up(next, actions, FailureReason::NotRetryable, now);
    }
    let retry_after = match &report.result {
        TransportResult::Response {
            retry_after: Some(value),
            ..
        } => parse_retry_after(value, now),
        _ => None,
    };
    match policy.next_delay(delivery.attempt_count, rng, retry_after) {
        Some(delay) => {
            let at = now + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
            next.state = DeliveryState::Retrying;
            next.next_attempt_at = Some(at);
            actions.push(Action::RequeueAt(at));
            Step {
                delivery: next,
                actions,
            }
        }
        None => give_up(next, actions, FailureReason::Exhausted, now),
    }
}

/// "Try now": a new generation, counter reset, same event id; `requested_by` says who
/// asked, for the log.
pub fn resend(delivery: &Delivery, requested_by: &str, now: DateTime<Utc>) -> Delivery {
    let mut next = delivery.clone();
    next.requested_by = Some(requested_by.to_owned());
    next.resent_for = None;
    next.resend_token = None;
    next.generation += 1;
    next.attempt_count = 0;
    next.state = DeliveryState::Pending;
    next.trigger = Trigger::Manual;
    next.next_attempt_at = Some(now);
    // An attempt still under way keeps its lease, and the resend's attempt waits for
    // it to end (`begin` finds it busy): with the lease cleared, the resend went out
    // while the first request was still open, the event on the wire twice at once,
    // even to an at-most-once endpoint (a hostile test).
    next.lease_until = delivery.lease_until.filter(|until| *until > now);
    // And is kept on record as interrupted until its worker reports back: with a
    // crash in between, nothing else would show it was sent.
    next.superseded = match delivery.state {
        DeliveryState::Delivering if next.lease_until.is_some() => {
            Some(Box::new(interrupted_attempt(delivery)))
        }
        _ if next.lease_until.is_some() => delivery.superseded.clone(),
        _ => None,
    };
    next.delivered_at = None;
    next.updated_at = now;
    next
}

/// `410 Gone`: the endpoint is retired, not failing.
pub const GONE: u16 = 410;

/// Why a delivery whose endpoint was deleted ended.
pub const ENDPOINT_DELETED_ERROR: &str = "the endpoint was deleted";

/// The endpoint was deleted by its owner: a waiting delivery ends as failed, on
/// purpose, with no failure notice (nobody is left to receive it). `None` when the
/// delivery had already ended.
pub fn endpoint_deleted(delivery: &Delivery, now: DateTime<Utc>) -> Option<Delivery> {
    ended_unsent(delivery, ENDPOINT_DELETED_ERROR, now)
}

/// Why a delivery whose event is gone ended.
pub const EVENT_GONE_ERROR: &str =
    "its event is gone (past the retention period since it was published): nothing to send";

/// The delivery's event is no longer stored (on AWS an event is kept for the
/// retention period from its publication, and a delivery may wait longer: behind an
/// endpoint disabled for longer, or on a custom schedule that long). There is nothing
/// to send, ever: a waiting delivery ends as failed, saying why, rather than being
/// tried until its attempts run out, each recorded as an attempt that never was.
/// `None` when the delivery had already ended.
pub fn event_gone(delivery: &Delivery, now: DateTime<Utc>) -> Option<Delivery> {
    ended_unsent(delivery, EVENT_GONE_ERROR, now)
}

/// A waiting delivery ended as failed for `reason`, with no attempt.
fn ended_unsent(delivery: &Delivery, reason: &str, now: DateTime<Utc>) -> Option<Delivery> {
    if delivery.state.is_terminal() {
        return None;
    }
    let mut next = delivery.clone();
    next.state = DeliveryState::Failed;
    next.last_error = Some(reason.into());
    next.next_attempt_at = None;
    next.lease_until = None;
    next.updated_at = now;
    Some(next)
}

/// The endpoint is disabled: keep the delivery, attempt nothing until re-enabled.
pub fn pause(delivery: &Delivery, now: DateTime<Utc>) -> Delivery {
    let mut next = delivery.clone();
    next.state = DeliveryState::Paused;
    next.next_attempt_at = None;
    next.lease_until = None;
    next.updated_at = now;
    next
}

fn give_up(
    mut next: Delivery,
    mut actions: Vec<Action>,
    reason: FailureReason,
    now: DateTime<Utc>,
) -> Step {
    next.state = match reason {
        FailureReason::Exhausted => DeliveryState::Exhausted,
        FailureReason::NotRetryable | FailureReason::AtMostOnce => DeliveryState::Failed,
    };
    next.next_attempt_at = None;
    next.lease_until = None;
    next.updated_at = now;
    actions.push(Action::MoveToFailures(FailureNotice {
        delivery_id: next.id.clone(),
        tenant_id: next.tenant_id.clone(),
        generation: next.generation,
        reason,
        failed_at: now,
    }));
    Step {
        delivery: next,
        actions,
    }
}

/// What started `delivery`'s current attempt, and who asked for it: a resend's
/// generation begins with the person's attempt, but its retries are the schedule's
/// (nobody asked for them), so the log credits only the first to the person.
fn started_by(delivery: &Delivery) -> (Trigger, Option<String>) {
    match delivery.trigger {
        Trigger::Manual if delivery.attempt_count <= 1 => {
            (Trigger::Manual, delivery.requested_by.clone())
        }
        _ => (Trigger::Scheduled, None),
    }
}

fn interrupted_attempt(delivery: &Delivery) -> Attempt {
    let (trigger, requested_by) = started_by(delivery);
    Attempt {
        id: AttemptId::interrupted(
            &delivery.id,
            delivery.generation,
            delivery.attempt_count,
            delivery.updated_at.timestamp_millis(),
        ),
        delivery_id: delivery.id.clone(),
        tenant_id: delivery.tenant_id.clone(),
        endpoint_id: delivery.endpoint_id.clone(),
        generation: delivery.generation,
        number: delivery.attempt_count,
        started_at: delivery.updated_at,
        duration_ms: 0,
        status_code: None,
        failure_kind: Some(FailureKind::Interrupted),
        error: Some(INTERRUPTED_ERROR.to_owned()),
        response_excerpt: None,
        trigger,
        requested_by,
    }
}

fn attempt_from_report(
    delivery: &Delivery,
    report: &AttemptReport,
    kind: Option<FailureKind>,
) -> Attempt {
    let (status_code, error, excerpt) = match &report.result {
        TransportResult::Response {
            status, excerpt, ..
        } => (
            Some(*status),
            kind.map(|k| format!("{}: HTTP {status}", k.as_str())),
            Some(truncate_utf8(excerpt, RESPONSE_EXCERPT_BYTES).to_owned()),
        ),
        TransportResult::Failed { kind, message } => {
            (None, Some(format!("{}: {message}", kind.as_str())), None)
        }
    };
    let (trigger, requested_by) = started_by(delivery);
    Attempt {
        id: AttemptId::generate(),
        delivery_id: delivery.id.clone(),
        tenant_id: delivery.tenant_id.clone(),
        endpoint_id: delivery.endpoint_id.clone(),
        generation: delivery.generation,
        number: delivery.attempt_count,
        started_at: report.started_at,
        duration_ms: report.duration.as_millis() as u64,
        status_code,
        failure_kind: kind,
        error,
        response_excerpt: excerpt,
        trigger,
        requested_by,
    }
}

#[cfg(test)]
#[path = "state_machine_tests.rs"]
mod tests;
