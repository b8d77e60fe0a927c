//! Tests of the delivery state machine, including a full `standard` schedule walked
//! under virtual time (31 hours in microseconds).

use super::*;
use crate::event::Event;
use crate::ids::{DeliveryId, EndpointId, EventId, TenantId};
use crate::retry::{RetryPreset, RetrySpec};
use chrono::TimeZone;
use rand::rngs::StdRng;
use rand::SeedableRng;

const LEASE: Duration = Duration::from_secs(40);

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 0, 0, 0).unwrap()
}

fn fresh() -> Delivery {
    let event = Event {
        id: EventId::generate(),
        tenant_id: TenantId::generate(),
        event_type: "lead.created".into(),
        payload: "{}".into(),
        created_at: t0(),
    };
    let ep = EndpointId::generate();
    Delivery::new(
        DeliveryId::for_event(&event.id, &ep, 0),
        &event,
        ep,
        false,
        t0(),
    )
}

fn policy(p: RetryPreset) -> RetryPolicy {
    RetrySpec::Preset(p).policy().unwrap()
}

fn status(code: u16, retry_after: Option<&str>) -> AttemptReport {
    AttemptReport {
        started_at: t0(),
        duration: Duration::from_millis(12),
        result: TransportResult::Response {
            status: code,
            retry_after: retry_after.map(str::to_owned),
            excerpt: "ok".into(),
        },
    }
}

fn started(d: &Delivery, mode: DeliveryMode, p: &RetryPolicy, now: DateTime<Utc>) -> Delivery {
    let step = begin(d, d.generation, mode, p, LEASE, now).unwrap();
    assert_eq!(step.actions.last(), Some(&Action::Send));
    assert_eq!(step.delivery.state, DeliveryState::Delivering);
    step.delivery
}

fn failure_reason(step: &Step) -> Option<FailureReason> {
    step.actions.iter().find_map(|a| match a {
        Action::MoveToFailures(n) => Some(n.reason),
        _ => None,
    })
}

#[test]
fn success_on_first_attempt() {
    let p = policy(RetryPreset::Standard);
    let d = started(&fresh(), DeliveryMode::AtLeastOnce, &p, t0());
    let step = complete(
        &d,
        &status(204, None),
        DeliveryMode::AtLeastOnce,
        &p,
        t0(),
        &mut StdRng::seed_from_u64(1),
    );
    assert_eq!(step.delivery.state, DeliveryState::Delivered);
    assert_eq!(step.delivery.attempt_count, 1);
    assert_eq!(step.delivery.delivered_at, Some(t0()));
    assert_eq!(step.actions.len(), 1);
    let Action::RecordAttempt(a) = &step.actions[0] else {
        panic!()
    };
    assert_eq!(
        (a.number, a.status_code, a.error.as_deref()),
        (1, Some(204), None)
    );
}

#[test]
fn standard_gives_up_on_400_but_persistent_retries() {
    let mut rng = StdRng::seed_from_u64(2);
    let std = policy(RetryPreset::Standard);
    let d = started(&fresh(), DeliveryMode::AtLeastOnce, &std, t0());
    let step = complete(
        &d,
        &status(400, None),
        DeliveryMode::AtLeastOnce,
        &std,
        t0(),
        &mut rng,
    );
    assert_eq!(step.delivery.state, DeliveryState::Failed);
    assert_eq!(failure_reason(&step), Some(FailureReason::NotRetryable));

    let per = policy(RetryPreset::Persistent);
    let d = started(&fresh(), DeliveryMode::AtLeastOnce, &per, t0());
    let step = complete(
        &d,
        &status(400, None),
        DeliveryMode::AtLeastOnce,
        &per,
        t0(),
        &mut rng,
    );
    assert_eq!(step.delivery.state, DeliveryState::Retrying);
    assert!(matches!(step.actions[1], Action::RequeueAt(_)));
}

#[test]
fn retry_after_on_429_is_honoured() {
    let p = policy(RetryPreset::Standard);
    let d = started(&fresh(), DeliveryMode::AtLeastOnce, &p, t0());
    let step = complete(
        &d,
        &status(429, Some("7200")),
        DeliveryMode::AtLeastOnce,
        &p,
        t0(),
        &mut StdRng::seed_from_u64(3),
    );
    let at = step.delivery.next_attempt_at.unwrap();
    assert!(at >= t0() + chrono::Duration::hours(2));
    assert_eq!(step.actions[1], Action::RequeueAt(at));
}

#[test]
fn standard_schedule_exhausts_after_nine_attempts_in_about_31_hours() {
    let p = policy(RetryPreset::Standard);
    let mut rng = StdRng::seed_from_u64(4);
    let mut now = t0();
    let mut d = fresh();
    loop {
        d = started(&d, DeliveryMode::AtLeastOnce, &p, now);
        let step = complete(
            &d,
            &status(503, None),
            DeliveryMode::AtLeastOnce,
            &p,
            now,
            &mut rng,
        );
        d = step.delivery.clone();
        match d.state {
            DeliveryState::Retrying => now = d.next_attempt_at.unwrap(),
            DeliveryState::Exhausted => {
                assert_eq!(failure_reason(&step), Some(FailureReason::Exhausted));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(d.attempt_count, 9);
    let hours = (now - t0()).num_minutes() as f64 / 60.0;
    assert!((24.0..=38.0).contains(&hours), "window {hours} h");
}

#[test]
fn at_most_once_never_retries_and_never_restarts() {
    let p = policy(RetryPreset::Standard);
    let mode = DeliveryMode::AtMostOnce;
    let d = started(&fresh(), mode, &p, t0());
    let step = complete(
        &d,
        &status(503, None),
        mode,
        &p,
        t0(),
        &mut StdRng::seed_from_u64(5),
    );
    assert_eq!(step.delivery.state, DeliveryState::Failed);
    assert_eq!(failure_reason(&step), Some(FailureReason::AtMostOnce));
    assert_eq!(
        begin(&step.delivery, 0, mode, &p, LEASE, t0()),
        Err(Skip::Terminal)
    );
}

#[test]
fn crash_mid_send_is_a_failure_for_at_most_once_and_a_resend_for_at_least_once() {
    let p = policy(RetryPreset::Standard);
    let after_lease = t0() + chrono::Duration::seconds(41);

    let d = started(&fresh(), DeliveryMode::AtMostOnce, &p, t0());
    assert_eq!(
        begin(&d, 0, DeliveryMode::AtMostOnce, &p, LEASE, t0()),
        Err(Skip::Busy(t0() + chrono::Duration::seconds(40)))
    );
    let step = begin(&d, 0, DeliveryMode::AtMostOnce, &p, LEASE, after_lease).unwrap();
    assert_eq!(step.delivery.state, DeliveryState::Failed);
    assert!(!step.actions.contains(&Action::Send));
    assert_eq!(failure_reason(&step), Some(FailureReason::AtMostOnce));
    let Action::RecordAttempt(a) = &step.actions[0] else {
        panic!()
    };
    assert_eq!(a.failure_kind, Some(FailureKind::Interrupted));

    let d = started(&fresh(), DeliveryMode::AtLeastOnce, &p, t0());
    let step = begin(&d, 0, DeliveryMode::AtLeastOnce, &p, LEASE, after_lease).unwrap();
    assert_eq!(step.delivery.state, DeliveryState::Delivering);
    assert_eq!(step.delivery.attempt_count, 2);
    assert!(matches!(step.actions[0], Action::RecordAttempt(_)));
    assert_eq!(step.actions[1], Action::Send);
}

#[test]
fn resend_resets_the_counter_and_supersedes_old_messages() {
    let p = policy(RetryPreset::None);
    let d = started(&fresh(), DeliveryMode::AtLeastOnce, &p, t0());
    let done = complete(
        &d,
        &status(500, None),
        DeliveryMode::AtLeastOnce,
        &p,
        t0(),
        &mut StdRng::seed_from_u64(6),
    );
    assert_eq!(done.delivery.state, DeliveryState::Exhausted);
    let again = resend(&done.delivery, "admin", t0());
    assert_eq!(
        (again.generation, again.attempt_count, again.trigger),
        (1, 0, Trigger::Manual)
    );
    assert_eq!(again.event_id, d.event_id);
    assert_eq!(
        begin(&again, 0, DeliveryMode::AtLeastOnce, &p, LEASE, t0()),
        Err(Skip::StaleGeneration)
    );
    let next = started(&again, DeliveryMode::AtLeastOnce, &p, t0());
    assert_eq!(next.attempt_count, 1);
}

/// A resend's first attempt is credited to who asked; the retries that follow it are
/// the schedule's, though the generation is still the resend's.
#[test]
fn only_a_resends_first_attempt_is_credited_to_who_asked() {
    let p = policy(RetryPreset::Standard);
    let mode = DeliveryMode::AtLeastOnce;
    let rng = &mut StdRng::seed_from_u64(7);
    let d = started(&fresh(), mode, &p, t0());
    let failed = complete(&d, &status(500, None), mode, &p, t0(), rng);
    let again = resend(&failed.delivery, "tenant:ten_1", t0());
    let first = started(&again, mode, &p, t0());
    let first_done = complete(&first, &status(500, None), mode, &p, t0(), rng);
    let attempt = &first_done.attempts()[0];
    assert_eq!(
        (attempt.trigger, attempt.requested_by.as_deref()),
        (Trigger::Manual, Some("tenant:ten_1"))
    );
    let due = first_done.delivery.next_attempt_at.expect("a retry is due");
    let retry = started(&first_done.delivery, mode, &p, due);
    let retry_done = complete(&retry, &status(500, None), mode, &p, due, rng);
    let attempt = &retry_done.attempts()[0];
    assert_eq!((attempt.number, attempt.trigger), (2, Trigger::Scheduled));
    assert_eq!(attempt.requested_by, None);
    assert_eq!(retry_done.delivery.trigger, Trigger::Manual);
    assert_eq!(
        retry_done.delivery.requested_by.as_deref(),
        Some("tenant:ten_1")
    );
}

/// A delivery waiting for a retry when its endpoint is switched to at most once is
/// sent no more, and ends on the failures list (it stayed waiting for good).
#[test]
fn a_retry_due_after_a_switch_to_at_most_once_ends_as_failed() {
    let p = policy(RetryPreset::Standard);
    let d = started(&fresh(), DeliveryMode::AtLeastOnce, &p, t0());
    let waiting = complete(
        &d,
        &status(503, None),
        DeliveryMode::AtLeastOnce,
        &p,
        t0(),
        &mut StdRng::seed_from_u64(3),
    );
    assert_eq!(waiting.delivery.state, DeliveryState::Retrying);
    let due = waiting.delivery.next_attempt_at.unwrap();
    let step = begin(
        &waiting.delivery,
        0,
        DeliveryMode::AtMostOnce,
        &p,
        LEASE,
        due,
    )
    .unwrap();
    assert!(!step.sends());
    assert_eq!(step.delivery.state, DeliveryState::Failed);
    assert_eq!(failure_reason(&step), Some(FailureReason::AtMostOnce));
}

/// A resend made while an attempt is under way goes out once that attempt's lease
/// ends, never beside it, at most once too; so does a second resend made meanwhile.
#[test]
fn a_resend_during_an_attempt_waits_for_its_lease() {
    let p = policy(RetryPreset::None);
    let mode = DeliveryMode::AtMostOnce;
    let running = started(&fresh(), mode, &p, t0());
    let lease_end = running.lease_until.unwrap();
    let soon = t0() + Duration::from_secs(1);
    let resent = resend(&running, "admin", soon);
    let resent_again = resend(&resent, "admin", soon);
    for r in [&resent, &resent_again] {
        assert_eq!(
            begin(r, r.generation, mode, &p, LEASE, soon),
            Err(Skip::Busy(lease_end))
        );
        let after = started(r, mode, &p, lease_end + Duration::from_millis(1));
        assert_eq!(after.attempt_count, 1);
    }
    // A resend after the lease ended (the worker died) does not wait.
    let later = resend(&running, "admin", lease_end);
    assert_eq!(later.lease_until, None);
}

/// The attempt a resend superseded is kept as interrupted, through a second resend,
/// and recorded when the resend's attempt starts (its worker never reported back).
#[test]
fn a_superseded_attempt_is_recorded_when_the_resend_starts() {
    let p = policy(RetryPreset::None);
    let mode = DeliveryMode::AtLeastOnce;
    let running = started(&fresh(), mode, &p, t0());
    let soon = t0() + Duration::from_secs(1);
    let resent = resend(&resend(&running, "admin", soon), "admin", soon);
    let superseded = resent.superseded.as_deref().expect("kept").clone();
    assert_eq!(
        (
            superseded.generation,
            superseded.number,
            superseded.failure_kind
        ),
        (0, 1, Some(FailureKind::Interrupted))
    );
    let after = running.lease_until.unwrap() + Duration::from_millis(1);
    let step = begin(&resent, resent.generation, mode, &p, LEASE, after).unwrap();
    assert_eq!(step.attempts(), [superseded]);
    assert_eq!(step.delivery.superseded, None);
    assert!(step.sends());
}

#[test]
fn transport_errors_are_logged_with_their_kind() {
    let p = policy(RetryPreset::Standard);
    let d = started(&fresh(), DeliveryMode::AtLeastOnce, &p, t0());
    let report = AttemptReport {
        started_at: t0(),
        duration: Duration::from_secs(10),
        result: TransportResult::Failed {
            kind: FailureKind::Timeout,
            message: "no answer in 10000 ms".into(),
        },
    };
    let step = complete(
        &d,
        &report,
        DeliveryMode::AtLeastOnce,
        &p,
        t0(),
        &mut StdRng::seed_from_u64(7),
    );
    assert_eq!(step.delivery.state, DeliveryState::Retrying);
    assert_eq!(
        step.delivery.last_error.as_deref(),
        Some("timeout: no answer in 10000 ms")
    );
    let Action::RecordAttempt(a) = &step.actions[0] else {
        panic!()
    };
    assert_eq!(a.duration_ms, 10_000);
    assert_eq!(a.failure_kind, Some(FailureKind::Timeout));
}

/// A started delivery of `mode` answered `410 Gone`.
fn gone(mode: DeliveryMode) -> Step {
    let p = policy(RetryPreset::Standard);
    let d = started(&fresh(), mode, &p, t0());
    complete(
        &d,
        &status(410, None),
        mode,
        &p,
        t0(),
        &mut StdRng::seed_from_u64(1),
    )
}

#[test]
fn gone_pauses_the_delivery_keeps_the_attempt_and_disables_the_endpoint() {
    let step = gone(DeliveryMode::AtLeastOnce);
    assert_eq!(step.delivery.state, DeliveryState::Paused);
    assert_eq!(step.delivery.next_attempt_at, None);
    assert_eq!(step.delivery.lease_until, None);
    assert_eq!(step.delivery.last_status_code, Some(410));
    assert_eq!(step.attempts().len(), 1);
    assert_eq!(step.attempts()[0].status_code, Some(410));
    assert!(step.actions.contains(&Action::DisableEndpoint));
    assert_eq!(
        failure_reason(&step),
        None,
        "gone is no failure of the delivery"
    );
    assert!(!step.sends());
}

/// At most once, a 410 is the one attempt: the delivery fails (and is on the failures
/// list) instead of waiting paused for an enable that could never send it again.
#[test]
fn gone_ends_an_at_most_once_delivery_as_failed_and_disables_the_endpoint() {
    let step = gone(DeliveryMode::AtMostOnce);
    assert_eq!(step.delivery.state, DeliveryState::Failed);
    assert_eq!(step.attempts()[0].status_code, Some(410));
    assert!(step.actions.contains(&Action::DisableEndpoint));
    assert_eq!(failure_reason(&step), Some(FailureReason::AtMostOnce));
    assert!(!step.sends());
}

#[test]
fn a_deleted_endpoint_fails_a_waiting_delivery_once_and_leaves_an_ended_one_alone() {
    let p = policy(RetryPreset::Standard);
    let later = t0() + chrono::Duration::seconds(5);
    for waiting in [
        fresh(),
        started(&fresh(), DeliveryMode::AtLeastOnce, &p, t0()),
    ] {
        let ended = endpoint_deleted(&waiting, later).expect("a waiting delivery ends");
        assert_eq!(ended.state, DeliveryState::Failed);
        assert_eq!(ended.last_error.as_deref(), Some(ENDPOINT_DELETED_ERROR));
        assert_eq!((ended.next_attempt_at, ended.lease_until), (None, None));
        assert_eq!(ended.updated_at, later);
        assert_eq!(endpoint_deleted(&ended, later), None);
    }
    let d = started(&fresh(), DeliveryMode::AtLeastOnce, &p, t0());
    let delivered = complete(
        &d,
        &status(200, None),
        DeliveryMode::AtLeastOnce,
        &p,
        t0(),
        &mut StdRng::seed_from_u64(1),
    );
    assert_eq!(endpoint_deleted(&delivered.delivery, later), None);
}
