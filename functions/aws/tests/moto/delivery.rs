//! Delivery on the AWS runtime: outbox transaction → stream → fan-out → SQS →
//! worker → receiver, with retries through visibility changes and schedules.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use entrega_aws::emulation::parse_at;
use entrega_core::delivery::DeliveryState;
use entrega_core::ids::DeliveryId;
use entrega_core::ports::{Clock, ManualClock};
use entrega_core::retry::{CustomRetry, RetrySpec};
use entrega_core::signature::verify;
use entrega_testkit::{eventually, Receiver, Reply};

use crate::harness::Stack;
use crate::support::*;

fn delays(delays_s: Vec<u64>) -> RetrySpec {
    RetrySpec::Custom(CustomRetry {
        delays_s,
        jitter: 0.0,
        retry_4xx: false,
    })
}

async fn delivery_state(stack: &Stack, id: &DeliveryId) -> Option<DeliveryState> {
    stack
        .services
        .store
        .get_delivery(id)
        .await
        .unwrap()
        .map(|d| d.state)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_committed_transaction_is_delivered_and_a_cancelled_one_is_not() {
    // The producer's transactions run before the pollers start (the stream is read
    // from its start, so nothing is missed): moto rolls a cancelled transaction back by
    // swapping in copies of the tables taken when it began, which silently drops any
    // write another connection made meanwhile. DynamoDB does not do that; the pollers'
    // writes must not race an emulator artefact.
    let mut stack = Stack::provisioned(std::sync::Arc::new(entrega_core::ports::SystemClock)).await;
    let s = &stack.services.clone();
    let tenant = tenant(s).await;
    let receiver = Receiver::answering(200).await;
    let ep = endpoint(s, &tenant, receiver.url("/crm"), RetrySpec::default()).await;

    let cancelled = event(
        s,
        &tenant,
        "lead.stage_changed",
        r#"{"lead":"L1","stage":"won"}"#,
    );
    assert!(
        !move_lead_stage(&stack, "L1", &cancelled, true).await,
        "the stale condition cancels"
    );
    let committed = event(
        s,
        &tenant,
        "lead.stage_changed",
        r#"{"lead":"L2","stage":"won"}"#,
    );
    assert!(move_lead_stage(&stack, "L2", &committed, false).await);
    stack.start_pollers();

    eventually(Duration::from_secs(60), "the committed event", || async {
        (receiver.count() == 1).then_some(())
    })
    .await;
    let got = &receiver.got()[0];
    assert_eq!(got.header("webhook-id"), committed.id.as_str());
    let ts: i64 = got.header("webhook-timestamp").parse().unwrap();
    verify(
        std::slice::from_ref(&ep.secret),
        committed.id.as_str(),
        ts,
        got.body.as_bytes(),
        got.header("webhook-signature"),
        Utc::now().timestamp(),
        300,
    )
    .expect("signed with the endpoint's secret");
    let id = DeliveryId::for_event(
        &committed.id,
        &ep.id,
        committed.created_at.timestamp_millis(),
    );
    eventually(Duration::from_secs(10), "delivered state", || async {
        (delivery_state(&stack, &id).await == Some(DeliveryState::Delivered)).then_some(())
    })
    .await;

    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.count(), 1, "the cancelled event was never sent");
    assert!(
        s.store
            .get_event(&cancelled.tenant_id, &cancelled.id)
            .await
            .unwrap()
            .is_none(),
        "no outbox item"
    );
    assert!(
        s.store
            .deliveries_of_event(&cancelled)
            .await
            .unwrap()
            .is_empty(),
        "no delivery record"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_comes_back_through_a_visibility_change() {
    let stack = Stack::start().await;
    let s = &stack.services;
    let tenant = tenant(s).await;
    let receiver = Receiver::start(vec![Reply::status(503)], Reply::status(200)).await;
    let ep = endpoint(s, &tenant, receiver.url("/"), delays(vec![2])).await;
    let e = event(s, &tenant, "a.b", "{}");
    assert!(move_lead_stage(&stack, "L", &e, false).await);
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
    let attempts = s.store.list_attempts(&id).await.unwrap();
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
    let s = &stack.services;
    let tenant = tenant(s).await;
    let receiver = Receiver::start(vec![Reply::status(503)], Reply::status(200)).await;
    let ep = endpoint(s, &tenant, receiver.url("/"), delays(vec![1, 1])).await;
    let e = event(s, &tenant, "a.b", "{}");
    assert!(move_lead_stage(&stack, "L", &e, false).await);
    let id = DeliveryId::for_event(&e.id, &ep.id, e.created_at.timestamp_millis());
    eventually(Duration::from_secs(30), "delivered", || async {
        (delivery_state(&stack, &id).await == Some(DeliveryState::Delivered)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.count(), 2, "exactly two attempts");
    let sqs = aws_sdk_sqs::Client::new(&stack.sdk);
    let dlq = sqs
        .get_queue_url()
        .queue_name(&stack.names.delivery_dlq)
        .send()
        .await
        .unwrap();
    let depth = sqs
        .get_queue_attributes()
        .queue_url(dlq.queue_url().unwrap())
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
        .send()
        .await
        .unwrap();
    let messages = depth
        .attributes()
        .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages))
        .cloned()
        .unwrap_or_default();
    assert_eq!(messages, "0", "nothing in the delivery DLQ");
}

/// The delivery queue's messages: (visible, in flight, delayed).
async fn queue_counts(stack: &Stack) -> (u64, u64, u64) {
    use aws_sdk_sqs::types::QueueAttributeName as Name;
    let out = aws_sdk_sqs::Client::new(&stack.sdk)
        .get_queue_attributes()
        .queue_url(&stack.resources.delivery_queue_url)
        .attribute_names(Name::All)
        .send()
        .await
        .unwrap();
    let get = |name: Name| -> u64 {
        out.attributes()
            .and_then(|a| a.get(&name))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
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
    let s = &stack.services;
    let tenant = tenant(s).await;
    let receiver = Receiver::answering(503).await;
    let ep = endpoint(s, &tenant, receiver.url("/"), delays(vec![120])).await;
    let e = event(s, &tenant, "a.b", "{}");
    assert!(move_lead_stage(&stack, "L", &e, false).await);
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
        let c = queue_counts(&stack).await;
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
    let s = &stack.services;
    let tenant = tenant(s).await;
    let receiver = Receiver::start(vec![Reply::status(503)], Reply::status(200)).await;
    let ep = endpoint(s, &tenant, receiver.url("/"), delays(vec![13 * 3600])).await;
    let e = event(s, &tenant, "a.b", "{}");
    assert!(move_lead_stage(&stack, "L", &e, false).await);
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
        Some(tenant.as_str()),
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

#[tokio::test(flavor = "multi_thread")]
async fn an_exhausted_delivery_reaches_the_failures_queue_and_its_record() {
    let stack = Stack::start().await;
    let s = &stack.services;
    let tenant = tenant(s).await;
    let receiver = Receiver::answering(500).await;
    let ep = endpoint(s, &tenant, receiver.url("/"), delays(vec![1])).await;
    // Entrega's own event about it travels the outbox like any other: with its id and
    // its type both reserved, the trigger takes it (either alone is refused).
    let watcher = Receiver::answering(200).await;
    let mut watching = endpoint(s, &tenant, watcher.url("/"), RetrySpec::default()).await;
    watching.event_types = vec!["entrega.delivery.exhausted".into()];
    s.store.update_endpoint(&watching).await.unwrap();
    let e = event(s, &tenant, "a.b", r#"{"keep":"me"}"#);
    assert!(move_lead_stage(&stack, "L", &e, false).await);
    let id = DeliveryId::for_event(&e.id, &ep.id, e.created_at.timestamp_millis());
    let dynamo = aws_sdk_dynamodb::Client::new(&stack.sdk);
    let failure = eventually(Duration::from_secs(40), "the failure record", || async {
        let out = dynamo
            .scan()
            .table_name(&stack.names.main_table)
            .filter_expression("begins_with(pk, :f)")
            .expression_attribute_values(
                ":f",
                aws_sdk_dynamodb::types::AttributeValue::S("FAIL#".into()),
            )
            .send()
            .await
            .unwrap();
        let json = out.items().first()?.get("json")?.as_s().ok()?.clone();
        Some(serde_json::from_str::<serde_json::Value>(&json).unwrap())
    })
    .await;
    assert_eq!(failure["delivery_id"], id.as_str());
    assert_eq!(
        failure["payload"], "",
        "the payload is stored once, in the outbox item"
    );
    let failure_id: entrega_core::ids::FailureId = failure["id"].as_str().unwrap().parse().unwrap();
    let failure = s
        .store
        .get_failure(&failure_id)
        .await
        .unwrap()
        .expect("readable through the port");
    assert_eq!(
        failure.reason,
        entrega_core::failure::FailureReason::Exhausted
    );
    assert_eq!(
        failure.payload, r#"{"keep":"me"}"#,
        "and attached again on read"
    );
    assert_eq!(failure.attempt_times.len(), 2);
    assert_eq!(failure.last_status_code, Some(500));
    assert_eq!(
        delivery_state(&stack, &id).await,
        Some(DeliveryState::Exhausted)
    );
    assert_eq!(receiver.count(), 2);
    eventually(Duration::from_secs(30), "the exhausted event", || async {
        (watcher.count() == 1).then_some(())
    })
    .await;
    let told: serde_json::Value = serde_json::from_str(&watcher.got()[0].body).unwrap();
    assert_eq!(told["type"], "entrega.delivery.exhausted");
    assert_eq!(told["data"]["delivery_id"], id.as_str());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_payload_near_the_limit_travels_by_reference() {
    let stack = Stack::start().await;
    let s = &stack.services;
    let tenant = tenant(s).await;
    let receiver = Receiver::answering(200).await;
    endpoint(s, &tenant, receiver.url("/"), RetrySpec::default()).await;
    // 240 KiB of quotes: escaped inside a message or a JSON record it would double.
    let payload = serde_json::to_string(&"\"".repeat(120 * 1024)).unwrap();
    assert!(payload.len() > 240 * 1024);
    let e = event(s, &tenant, "big.one", &payload);
    assert!(move_lead_stage(&stack, "L", &e, false).await);
    eventually(Duration::from_secs(30), "the large webhook", || async {
        (receiver.count() == 1).then_some(())
    })
    .await;
    let body: serde_json::Value = serde_json::from_str(&receiver.got()[0].body).unwrap();
    assert_eq!(
        body["data"].as_str().unwrap().len(),
        120 * 1024,
        "delivered whole, never truncated"
    );
}

/// `entrega outbox replay`: events the outbox trigger never fanned out (the stream not
/// read here) are fanned out by a replay from a time; a second replay makes nothing
/// twice, an older event is left alone, and each event is delivered once.
#[tokio::test(flavor = "multi_thread")]
async fn an_outbox_replay_fans_out_what_the_trigger_missed_once() {
    use entrega_core::handlers::replay::replay_outbox;
    let mut stack = Stack::provisioned(Arc::new(entrega_core::ports::SystemClock)).await;
    let s = &stack.services.clone();
    let tenant = tenant(s).await;
    let receiver = Receiver::answering(200).await;
    let ep = endpoint(s, &tenant, receiver.url("/"), RetrySpec::default()).await;
    let mut old = event(s, &tenant, "a.b", "{}");
    old.created_at -= chrono::Duration::hours(2);
    assert!(move_lead_stage(&stack, "L0", &old, false).await);
    let since = Utc::now() - chrono::Duration::minutes(1);
    let mut recent = Vec::new();
    for i in 1..=3 {
        let e = event(s, &tenant, "a.b", "{}");
        assert!(move_lead_stage(&stack, &format!("L{i}"), &e, false).await);
        recent.push(e);
    }

    // A producer item that can never be an event: counted, not replayed.
    aws_sdk_dynamodb::Client::new(&stack.sdk)
        .put_item()
        .table_name(&stack.names.outbox_table)
        .item(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S("no-type".into()),
        )
        .item(
            "tenant_id",
            aws_sdk_dynamodb::types::AttributeValue::S(tenant.to_string()),
        )
        .send()
        .await
        .unwrap();

    let replay_all = || async {
        let (mut events, mut malformed, mut cursor) = (0, 0, None::<String>);
        loop {
            let step = replay_outbox(s, since, cursor.as_deref()).await.unwrap();
            events += step.events;
            malformed += step.malformed;
            match step.next_cursor {
                Some(next) => cursor = Some(next),
                None => return (events, malformed),
            }
        }
    };
    assert_eq!(
        replay_all().await,
        (3, 1),
        "the three recent events, not the old one; the malformed item counted"
    );
    assert_eq!(replay_all().await, (3, 1), "a second replay finds the same");
    for e in &recent {
        let made = s.store.deliveries_of_event(e).await.unwrap();
        assert_eq!(
            made.len(),
            1,
            "one delivery per event, however often replayed"
        );
        assert_eq!(made[0].endpoint_id, ep.id);
    }
    assert!(s.store.deliveries_of_event(&old).await.unwrap().is_empty());

    // The replayed deliveries go out, once each (the stream, read now, finds them made).
    stack.start_pollers();
    eventually(Duration::from_secs(60), "four delivered", || async {
        (receiver.count() >= 4).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        (receiver.count(), receiver.distinct_webhook_ids().len()),
        (4, 4),
        "each event once"
    );
}

/// A delivery expires (DynamoDB's TTL) only once settled: one paused behind an
/// endpoint disabled for longer than the retention period was dropped unsent; the
/// embedded store keeps waiting and paused deliveries the same way.
#[tokio::test(flavor = "multi_thread")]
async fn only_a_settled_delivery_expires() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use entrega_aws::dynamo::{keys, PK, SK, TTL_ATTRIBUTE};

    let stack = Stack::provisioned(Arc::new(entrega_core::ports::SystemClock)).await;
    let services = &stack.services;
    let tenant = tenant(services).await;
    let ep = endpoint(
        services,
        &tenant,
        "https://hooks.example.com/".into(),
        delays(vec![1]),
    )
    .await;
    let event = event(services, &tenant, "a.b", "{}");
    let id = DeliveryId::for_event(&event.id, &ep.id, event.created_at.timestamp_millis());
    let fresh = entrega_core::delivery::Delivery::new(id, &event, ep.id.clone(), false, Utc::now());
    let (mut d, _) = services
        .store
        .create_delivery_if_absent(&fresh)
        .await
        .unwrap();
    let dynamo = aws_sdk_dynamodb::Client::new(&stack.sdk);
    let mut expires = Vec::new();
    for state in [
        DeliveryState::Pending,
        DeliveryState::Paused,
        DeliveryState::Retrying,
        DeliveryState::Delivered,
    ] {
        if d.state != state {
            d.state = state;
            d = services.store.save_delivery(&d, &[]).await.unwrap();
        }
        let (pk, sk) = keys::delivery(&d.id);
        let item = dynamo
            .get_item()
            .table_name(&stack.resources.main_table)
            .key(PK, AttributeValue::S(pk))
            .key(SK, AttributeValue::S(sk))
            .send()
            .await
            .unwrap()
            .item
            .expect("the delivery item");
        expires.push(item.contains_key(TTL_ATTRIBUTE));
    }
    assert_eq!(expires, [false, false, false, true]);
}
