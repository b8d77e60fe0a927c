//! Retries on the AWS runtime: a visibility change for a short wait (never 0 s), a
//! delayed message for a longer one, a schedule past 12 hours.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use entrega_aws::emulation::parse_at;
use entrega_core::delivery::DeliveryState;
use entrega_core::endpoint::Endpoint;
use entrega_core::event::Event;
use entrega_core::ids::DeliveryId;
use entrega_core::ports::{Clock, ManualClock};
use entrega_testkit::{eventually, Receiver, Reply};

use crate::delivery::{delays, delivery_state};
use crate::harness::Stack;
use crate::support::*;

/// A new tenant's endpoint at `receiver` retrying after `delays_s`, and one event for
/// it committed through the outbox: the endpoint and the event.
async fn one_event_retried(
    stack: &Stack,
    receiver: &Receiver,
    delays_s: Vec<u64>,
) -> (Endpoint, Event) {
    let s = &stack.services;
    let tenant = tenant(s).await;
    let ep = endpoint(s, &tenant, receiver.url("/"), delays(delays_s)).await;
    let e = event(s, &tenant, "a.b", "{}");
    assert!(move_lead_stage(stack, "L", &e, false).await);
    (ep, e)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_comes_back_through_a_visibility_change() {
    let stack = Stack::start().await;
    let receiver = Receiver::start(vec![Reply::status(503)], Reply::status(200)).await;
    let (ep, e) = one_event_retried(&stack, &receiver, vec![2]).await;
    eventually(Duration::from_secs(30), "two attempts", || async {
        (receiver.count() == 2).then_some(())
    })
    .await;
    let got = receiver.got();
    assert_eq!(got[0].header("webhook-id"), got[1].header("webhook-id"));
    let gap = got[1].at - got[0].at;
    assert!(
        gap >= Duration::from_millis(1900),
        "attempt 2 after {gap:?}, policy says 2 s"
    );
    let id = DeliveryId::for_event(&e.id, &ep.id, e.created_at.timestamp_millis());
    eventually(Duration::from_secs(10), "delivered", || async {
        (delivery_state(&stack, &id).await == Some(DeliveryState::Delivered)).then_some(())
    })
    .await;
    let attempts = stack.services.store.list_attempts(&id).await.unwrap();
    assert_eq!(
        attempts.iter().map(|a| a.status_code).collect::<Vec<_>>(),
        [Some(503), Some(200)]
    );
}

/// One-second retries never spin: a message back a fraction of a second early is
/// hidden for a whole second, not 0 s, so it is delivered on its second attempt and
/// never burns its receive count into the dead-letter queue.
#[tokio::test(flavor = "multi_thread")]
async fn one_second_retries_are_delivered_without_spinning_into_the_dlq() {
    let stack = Stack::start().await;
    let receiver = Receiver::start(vec![Reply::status(503)], Reply::status(200)).await;
    let (ep, e) = one_event_retried(&stack, &receiver, vec![1, 1]).await;
    let id = DeliveryId::for_event(&e.id, &ep.id, e.created_at.timestamp_millis());
    eventually(Duration::from_secs(30), "delivered", || async {
        (delivery_state(&stack, &id).await == Some(DeliveryState::Delivered)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.count(), 2, "exactly two attempts");
    let dlq = aws_sdk_sqs::Client::new(&stack.sdk)
        .get_queue_url()
        .queue_name(&stack.names.delivery_dlq)
        .send()
        .await
        .unwrap();
    let (messages, _, _) = queue_counts(&stack, dlq.queue_url().unwrap()).await;
    assert_eq!(messages, 0, "nothing in the delivery DLQ");
}

/// A queue's messages: (visible, in flight, delayed).
async fn queue_counts(stack: &Stack, queue_url: &str) -> (u64, u64, u64) {
    use aws_sdk_sqs::types::QueueAttributeName as Name;
    let out = aws_sdk_sqs::Client::new(&stack.sdk)
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(Name::All)
        .send()
        .await
        .unwrap();
    let get = |name: Name| -> u64 {
        let value = out.attributes().and_then(|a| a.get(&name));
        value
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name:?} of {queue_url}: {value:?}"))
    };
    (
        get(Name::ApproximateNumberOfMessages),
        get(Name::ApproximateNumberOfMessagesNotVisible),
        get(Name::ApproximateNumberOfMessagesDelayed),
    )
}

/// A wait longer than a minute is not spent in flight: the message is sent again,
/// delayed, and the received one deleted, so a dead endpoint's retries cannot fill
/// SQS's in-flight limit for every tenant.
#[tokio::test(flavor = "multi_thread")]
async fn a_two_minute_retry_waits_as_a_delayed_message_not_in_flight() {
    let stack = Stack::start().await;
    let receiver = Receiver::answering(503).await;
    let (ep, e) = one_event_retried(&stack, &receiver, vec![120]).await;
    let id = DeliveryId::for_event(&e.id, &ep.id, e.created_at.timestamp_millis());
    eventually(
        Duration::from_secs(30),
        "the first attempt recorded",
        || async {
            (delivery_state(&stack, &id).await == Some(DeliveryState::Retrying)).then_some(())
        },
    )
    .await;
    let counts = eventually(Duration::from_secs(10), "a delayed message", || async {
        let c = queue_counts(&stack, &stack.resources.delivery_queue_url).await;
        (c == (0, 0, 1)).then_some(c)
    })
    .await;
    assert_eq!(counts, (0, 0, 1), "none in flight; one delayed");
    assert_eq!(receiver.count(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_beyond_12_hours_goes_through_a_schedule() {
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let stack = Stack::start_with_clock(clock.clone()).await;
    let receiver = Receiver::start(vec![Reply::status(503)], Reply::status(200)).await;
    let (ep, e) = one_event_retried(&stack, &receiver, vec![13 * 3600]).await;
    eventually(Duration::from_secs(30), "the first attempt", || async {
        (receiver.count() == 1).then_some(())
    })
    .await;

    let scheduler = aws_sdk_scheduler::Client::new(&stack.sdk);
    let sqs = aws_sdk_sqs::Client::new(&stack.sdk);
    let schedule = eventually(Duration::from_secs(10), "a schedule", || async {
        let listed = scheduler
            .list_schedules()
            .group_name(&stack.resources.schedule_group)
            .send()
            .await
            .unwrap();
        let name = listed.schedules().first()?.name()?.to_owned();
        Some(
            scheduler
                .get_schedule()
                .group_name(&stack.resources.schedule_group)
                .name(name)
                .send()
                .await
                .unwrap(),
        )
    })
    .await;
    let at = parse_at(schedule.schedule_expression().unwrap()).unwrap();
    let wanted = clock.now() + chrono::Duration::hours(13);
    assert!(
        (at - wanted).num_seconds().abs() <= 60,
        "scheduled at {at}, wanted about {wanted}"
    );
    let target = schedule.target().unwrap();
    assert_eq!(target.arn(), stack.resources.delivery_queue_arn);
    assert_eq!(
        target.sqs_parameters().and_then(|p| p.message_group_id()),
        Some(e.tenant_id.as_str()),
        "the retry keeps its tenant's message group (fair queueing)"
    );
    assert_eq!(
        target.dead_letter_config().and_then(|d| d.arn()),
        Some(stack.resources.delivery_dlq_arn.as_str())
    );
    assert!(target
        .retry_policy()
        .is_some_and(|r| r.maximum_event_age_in_seconds() == Some(86_400)));

    // Nothing is due yet; then 13 hours pass (virtual time) and it fires.
    assert_eq!(
        stack
            .emulation()
            .fire_due_schedules(&scheduler, &sqs)
            .await
            .unwrap(),
        0
    );
    clock.advance(Duration::from_secs(13 * 3600 + 60));
    eventually(Duration::from_secs(30), "the second attempt", || async {
        (receiver.count() == 2).then_some(())
    })
    .await;
    let id = DeliveryId::for_event(&e.id, &ep.id, e.created_at.timestamp_millis());
    eventually(Duration::from_secs(10), "delivered", || async {
        (delivery_state(&stack, &id).await == Some(DeliveryState::Delivered)).then_some(())
    })
    .await;
    let listed = scheduler
        .list_schedules()
        .group_name(&stack.resources.schedule_group)
        .send()
        .await
        .unwrap();
    assert!(listed.schedules().is_empty(), "a fired schedule is deleted");
}
