//! Delivery on the AWS runtime: outbox transaction → stream → fan-out → SQS →
//! worker → receiver, with retries through visibility changes and schedules.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use entrega_core::delivery::DeliveryState;
use entrega_core::endpoint::Endpoint;
use entrega_core::ids::DeliveryId;
use entrega_core::retry::{CustomRetry, RetrySpec};
use entrega_core::signature::verify;
use entrega_testkit::{eventually, Receiver};

use crate::harness::Stack;
use crate::support::*;

pub(crate) fn delays(delays_s: Vec<u64>) -> RetrySpec {
    RetrySpec::Custom(CustomRetry {
        delays_s,
        jitter: 0.0,
        retry_4xx: false,
    })
}

pub(crate) async fn delivery_state(stack: &Stack, id: &DeliveryId) -> Option<DeliveryState> {
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
    // Created before the old event, as it must have been to get it.
    let ep = Endpoint::new(
        tenant.clone(),
        receiver.url("/"),
        Utc::now() - chrono::Duration::hours(3),
    );
    s.store
        .create_endpoint(&ep, entrega_core::endpoint::MAX_ENDPOINTS_PER_TENANT)
        .await
        .unwrap();
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
