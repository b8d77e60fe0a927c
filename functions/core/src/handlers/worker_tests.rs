//! The worker's branches, each on the in-memory world: real handlers, a manual clock,
//! a scripted transport, nothing leaving the process.

use std::time::Duration;

use super::*;
use crate::delivery::DeliveryState;
use crate::endpoint::DeliveryMode;
use crate::handlers::worker_case::{case, retry_after};
use crate::memory::response;
use crate::ports::{Clock, MessageQueue};
use crate::retry::RetrySpec;

#[tokio::test]
async fn a_success_is_recorded_delivered_with_its_attempt_and_signed_headers() {
    let c = case(|_| {}).await;
    let d = c.publish().await;
    assert_eq!(c.handle_next().await, Disposition::Done);
    let stored = c.delivery(&d.id).await;
    assert_eq!(stored.state, DeliveryState::Delivered);
    assert_eq!(stored.attempt_count, 1);
    let attempts = c.attempts(&d.id).await;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].status_code, Some(200));
    let requests = c.world.transport.requests();
    assert_eq!(requests.len(), 1);
    let header = |name: &str| {
        requests[0]
            .headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(header("webhook-id").as_deref(), Some(d.event_id.as_str()));
    assert!(header("webhook-signature").is_some_and(|s| s.starts_with("v1,")));
    assert!(c.world.deliveries.is_empty(), "the message is settled");
}

#[tokio::test]
async fn a_503_is_retried_on_schedule_and_never_early() {
    let c = case(|e| e.retry = retry_after(vec![10])).await;
    c.world.transport.then([response(503)]);
    let d = c.publish().await;
    assert_eq!(
        c.handle_next().await,
        Disposition::RetryIn(Duration::from_secs(10))
    );
    let waiting = c.delivery(&d.id).await;
    assert_eq!(waiting.state, DeliveryState::Retrying);
    assert_eq!(
        waiting.next_attempt_at,
        Some(c.world.clock.now() + chrono::Duration::seconds(10))
    );

    // A copy of the message that comes back early (a duplicate) sends nothing.
    c.world
        .deliveries
        .send(vec![
            DeliveryTask::for_delivery(&waiting).message(8, Duration::ZERO)
        ])
        .await
        .unwrap();
    c.advance(4);
    assert_eq!(
        c.handle_next().await,
        Disposition::RetryIn(Duration::from_secs(6))
    );
    assert_eq!(c.world.transport.requests().len(), 1, "not before its time");

    c.advance(6);
    assert_eq!(c.handle_next().await, Disposition::Done);
    let delivered = c.delivery(&d.id).await;
    assert_eq!(delivered.state, DeliveryState::Delivered);
    let statuses: Vec<_> = c
        .attempts(&d.id)
        .await
        .iter()
        .map(|a| a.status_code)
        .collect();
    assert_eq!(statuses, [Some(503), Some(200)]);
}

/// A retry due after its endpoint was switched to at most once is not sent: the
/// delivery ends failed with its notice (it waited for good before, found by a
/// hostile test).
#[tokio::test]
async fn a_retry_after_a_switch_to_at_most_once_fails_with_a_notice() {
    let c = case(|e| e.retry = retry_after(vec![1, 1])).await;
    c.world.transport.then([response(503)]);
    let d = c.publish().await;
    assert!(matches!(c.handle_next().await, Disposition::RetryIn(_)));
    c.change_endpoint(|e| e.mode = DeliveryMode::AtMostOnce)
        .await;
    c.advance(2);
    assert_eq!(c.handle_next().await, Disposition::Done);
    assert_eq!(c.delivery(&d.id).await.state, DeliveryState::Failed);
    assert_eq!(c.world.transport.requests().len(), 1, "not sent again");
    assert_eq!(c.world.failures.len(), 1, "the failure handler is told");
}

#[tokio::test]
async fn gone_pauses_the_delivery_and_disables_the_endpoint_without_a_failure() {
    let c = case(|_| {}).await;
    c.world.transport.then([response(410)]);
    let d = c.publish().await;
    assert_eq!(c.handle_next().await, Disposition::Done);
    assert_eq!(c.delivery(&d.id).await.state, DeliveryState::Paused);
    let endpoint = c.stored_endpoint().await;
    assert!(endpoint.disabled, "410 disables the endpoint");
    assert!(
        c.world.failures.is_empty(),
        "no failure notice for a gone URL"
    );

    // What is published meanwhile waits, paused, and is not sent.
    let later = c.publish().await;
    assert_eq!(later.state, DeliveryState::Paused);
    assert_eq!(c.world.transport.requests().len(), 1);
}

/// At most once, the 410 was the one attempt: the delivery fails and its failure
/// notice goes out, beside the endpoint being disabled.
#[tokio::test]
async fn gone_at_most_once_fails_the_delivery_with_a_notice_and_disables_the_endpoint() {
    let c = case(|e| e.mode = DeliveryMode::AtMostOnce).await;
    c.world.transport.then([response(410)]);
    let d = c.publish().await;
    assert_eq!(c.handle_next().await, Disposition::Done);
    assert_eq!(c.delivery(&d.id).await.state, DeliveryState::Failed);
    assert!(
        c.stored_endpoint().await.disabled,
        "410 disables the endpoint"
    );
    assert!(!c.world.failures.is_empty(), "the failure handler is told");
}

#[tokio::test]
async fn a_deleted_endpoint_ends_its_delivery_quietly() {
    let c = case(|_| {}).await;
    let d = c.publish().await;
    c.world
        .services
        .store
        .delete_endpoint(&c.endpoint.id)
        .await
        .unwrap();
    assert_eq!(c.handle_next().await, Disposition::Done);
    let ended = c.delivery(&d.id).await;
    assert_eq!(ended.state, DeliveryState::Failed);
    assert_eq!(
        ended.last_error.as_deref(),
        Some(state_machine::ENDPOINT_DELETED_ERROR)
    );
    assert!(c.world.transport.requests().is_empty());
    assert!(c.world.failures.is_empty(), "nobody is left to tell");
}

#[tokio::test]
async fn a_message_left_by_a_resend_that_lost_its_race_sends_nothing() {
    let c = case(|_| {}).await;
    let d = c.publish().await;
    assert_eq!(c.handle_next().await, Disposition::Done);
    let delivered = c.delivery(&d.id).await;
    // Two resends read the delivery as delivered. The one that loses queued its
    // message, naming the generation both planned, before its write was refused.
    let lost = crate::handlers::task::DeliveryTask {
        generation: delivered.generation + 1,
        resend_token: Some(42),
        ..crate::handlers::task::DeliveryTask::for_resend(&delivered, c.world.clock.now())
    };
    c.world
        .services
        .deliveries
        .send(vec![lost.message(8, Duration::ZERO)])
        .await
        .unwrap();
    let won = super::super::resend::resend_delivery(&c.world.services, &delivered, "admin")
        .await
        .unwrap();
    assert_eq!(won.generation, lost.generation);
    assert_ne!(won.resend_token, lost.resend_token);

    assert_eq!(
        c.handle_next().await,
        Disposition::Done,
        "the loser's message"
    );
    assert_eq!(
        c.world.transport.requests().len(),
        1,
        "nothing sent for the message of the resend that lost"
    );
    assert_eq!(
        c.handle_next().await,
        Disposition::Done,
        "the winner's message"
    );
    assert_eq!(
        c.world.transport.requests().len(),
        2,
        "the resend went once"
    );
    assert_eq!(c.delivery(&d.id).await.state, DeliveryState::Delivered);
}

#[tokio::test]
async fn a_delivery_whose_event_is_gone_ends_failed_with_no_attempt() {
    let c = case(|_| {}).await;
    let d = c.publish().await;
    c.world.store.expire_event(&d.tenant_id, &d.event_id);
    assert_eq!(c.handle_next().await, Disposition::Done);
    let ended = c.delivery(&d.id).await;
    assert_eq!(ended.state, DeliveryState::Failed);
    assert_eq!(
        ended.last_error.as_deref(),
        Some(state_machine::EVENT_GONE_ERROR)
    );
    assert!(
        c.attempts(&d.id).await.is_empty(),
        "nothing was sent, and no attempt is recorded"
    );
    assert!(c.world.transport.requests().is_empty());
    assert!(c.world.deliveries.is_empty(), "the message is settled");
}

#[tokio::test]
async fn at_most_once_interrupted_after_begin_is_never_sent_and_becomes_a_failure() {
    let c = case(|e| e.mode = DeliveryMode::AtMostOnce).await;
    let d = c.publish().await;
    // A worker began the attempt ("delivering" written) and died before sending.
    let policy = policy_of(&c.endpoint);
    let lease = Duration::from_secs(40);
    let step = state_machine::begin(
        &d,
        0,
        DeliveryMode::AtMostOnce,
        &policy,
        lease,
        c.world.clock.now(),
    )
    .unwrap();
    c.world
        .services
        .store
        .save_delivery(&step.delivery, &[])
        .await
        .unwrap();

    // Within the lease, the message waits for the attempt that may be running.
    let first = c.handle_next().await;
    assert!(matches!(first, Disposition::RetryIn(_)), "{first:?}");
    assert!(c.world.transport.requests().is_empty());

    c.advance(41);
    assert_eq!(c.handle_next().await, Disposition::Done);
    assert!(c.world.transport.requests().is_empty(), "never sent twice");
    let failed = c.delivery(&d.id).await;
    assert_eq!(failed.state, DeliveryState::Failed);
    assert_eq!(c.world.failures.len(), 1, "the failure handler is told");
    let attempts = c.attempts(&d.id).await;
    assert_eq!(
        attempts[0].failure_kind,
        Some(crate::outcome::FailureKind::Interrupted)
    );
}

/// Two workers (a duplicate message) find the same at-most-once attempt interrupted:
/// one settles it, and the log shows the interruption once, though the loser's save
/// records its attempts too.
#[tokio::test]
async fn two_workers_finding_one_interrupted_attempt_record_it_once() {
    let c = case(|e| e.mode = DeliveryMode::AtMostOnce).await;
    let d = c.publish().await;
    let policy = policy_of(&c.endpoint);
    let lease = Duration::from_secs(40);
    let now = c.world.clock.now();
    let step = state_machine::begin(&d, 0, DeliveryMode::AtMostOnce, &policy, lease, now).unwrap();
    let store = &c.world.services.store;
    store.save_delivery(&step.delivery, &[]).await.unwrap();

    c.advance(41);
    let read = c.delivery(&d.id).await;
    let later = c.world.clock.now();
    let steps: Vec<_> = (0..2)
        .map(|_| {
            state_machine::begin(&read, 1, DeliveryMode::AtMostOnce, &policy, lease, later).unwrap()
        })
        .collect();
    assert_eq!(steps[0].attempts().len(), 1, "each finds the interruption");
    let first = store
        .save_delivery(&steps[0].delivery, &steps[0].attempts())
        .await;
    let second = store
        .save_delivery(&steps[1].delivery, &steps[1].attempts())
        .await;
    assert!(first.is_ok());
    assert!(matches!(second, Err(crate::ports::StoreError::Conflict(_))));
    let attempts = c.attempts(&d.id).await;
    assert_eq!(
        attempts.len(),
        1,
        "one interruption, one record: {attempts:?}"
    );
    assert_eq!(
        attempts[0].failure_kind,
        Some(crate::outcome::FailureKind::Interrupted)
    );
}

#[tokio::test]
async fn a_message_from_before_a_resend_sends_nothing() {
    let c = case(|_| {}).await;
    let d = c.publish().await;
    let stale = c.receive().await.unwrap();

    // Support resends it before the old message is handled.
    let current = c.delivery(&d.id).await;
    let resent = state_machine::resend(&current, "support", c.world.clock.now());
    let saved = c
        .world
        .services
        .store
        .save_delivery(&resent, &[])
        .await
        .unwrap();
    c.world
        .deliveries
        .send(vec![
            DeliveryTask::for_delivery(&saved).message(8, Duration::ZERO)
        ])
        .await
        .unwrap();

    let old = handle_delivery(&c.world.services, &stale.body, stale.receive_count)
        .await
        .unwrap();
    assert_eq!(old, Disposition::Done);
    assert!(
        c.world.transport.requests().is_empty(),
        "the old generation is void"
    );

    assert_eq!(c.handle_next().await, Disposition::Done);
    let delivered = c.delivery(&d.id).await;
    assert_eq!(
        (delivered.state, delivered.generation),
        (DeliveryState::Delivered, 1)
    );
    assert_eq!(c.world.transport.requests().len(), 1);
}

/// The worker may see a resend's message before the resend writes its generation
/// (the message is queued first). It waits for the write counting from when the
/// message was queued, not from the delivery's last change, which for a delivery that
/// failed an hour ago is an hour back.
#[tokio::test]
async fn a_resend_of_an_old_delivery_seen_before_its_write_waits_for_it() {
    let c = case(|e| e.retry = RetrySpec::Preset(crate::retry::RetryPreset::None)).await;
    c.world.transport.then([response(500)]);
    let d = c.publish().await;
    assert_eq!(c.handle_next().await, Disposition::Done);
    assert_eq!(c.delivery(&d.id).await.state, DeliveryState::Exhausted);
    c.advance(3600);

    let current = c.delivery(&d.id).await;
    let resent = state_machine::resend(&current, "support", c.world.clock.now());
    let early = DeliveryTask::for_resend(&resent, c.world.clock.now());
    let body = serde_json::to_string(&early).unwrap();
    // The worker runs between the resend's send and its write.
    assert_eq!(
        handle_delivery(&c.world.services, &body, 1).await.unwrap(),
        Disposition::RetryIn(RESEND_WRITE_RECHECK),
        "kept for the write, not dropped"
    );
    c.world
        .services
        .store
        .save_delivery(&resent, &[])
        .await
        .unwrap();
    c.advance(2);
    assert_eq!(
        handle_delivery(&c.world.services, &body, 2).await.unwrap(),
        Disposition::Done
    );
    let delivered = c.delivery(&d.id).await;
    assert_eq!(
        (delivered.state, delivered.generation),
        (DeliveryState::Delivered, 1)
    );

    // A resend whose write never happened is given up after the grace period.
    let never = DeliveryTask::for_resend(
        &state_machine::resend(&delivered, "support", c.world.clock.now()),
        c.world.clock.now(),
    );
    let body = serde_json::to_string(&never).unwrap();
    c.advance(61);
    assert_eq!(
        handle_delivery(&c.world.services, &body, 3).await.unwrap(),
        Disposition::Done
    );
    assert_eq!(c.world.transport.requests().len(), 2, "nothing sent for it");
}

#[tokio::test]
async fn a_disabled_endpoint_pauses_its_waiting_delivery() {
    let c = case(|_| {}).await;
    let d = c.publish().await;
    c.change_endpoint(|e| e.disabled = true).await;
    assert_eq!(c.handle_next().await, Disposition::Done);
    assert_eq!(c.delivery(&d.id).await.state, DeliveryState::Paused);
    assert!(c.world.transport.requests().is_empty());
}
