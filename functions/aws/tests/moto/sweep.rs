//! The sweeper on AWS, through the dlq-analyzer's entry point as its schedule calls it:
//! a delivery whose message vanished is queued again and delivered once.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::Utc;
use entrega_aws::dynamo::{keys, PK, SK};
use entrega_aws::lambda::analyzer_event;
use entrega_core::delivery::DeliveryState;
use entrega_core::handlers::fanout::fan_out;
use entrega_core::ids::DeliveryId;
use entrega_core::ports::ManualClock;
use entrega_core::retry::RetrySpec;
use entrega_testkit::{eventually, Receiver};
use serde_json::json;

use crate::harness::Stack;
use crate::support::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_delivery_whose_message_was_lost_is_swept_back_and_delivered_once() {
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let mut stack = Stack::provisioned(clock.clone()).await;
    let s = stack.services.clone();
    let tenant = tenant(&s).await;
    let receiver = Receiver::answering(204).await;
    let ep = endpoint(&s, &tenant, receiver.url("/"), RetrySpec::default()).await;
    let lost = event(&s, &tenant, "a.b", r#"{"lost":true}"#);
    s.store.publish(&lost).await.unwrap();
    fan_out(&s, &lost).await.unwrap();
    let lost_id = DeliveryId::for_event(&lost.id, &ep.id, lost.created_at.timestamp_millis());
    assert!(
        !due_indexed(&stack, &lost_id).await,
        "a young delivery costs no due index entry"
    );
    // The message vanishes: a queue purged by hand.
    aws_sdk_sqs::Client::new(&stack.sdk)
        .purge_queue()
        .queue_url(&stack.resources.delivery_queue_url)
        .send()
        .await
        .unwrap();

    clock.advance(Duration::from_secs(30 * 60));
    // One due just now is left alone: its message is merely as late as a busy queue.
    let fresh = event(&s, &tenant, "a.b", r#"{"lost":false}"#);
    s.store.publish(&fresh).await.unwrap();
    fan_out(&s, &fresh).await.unwrap();
    let sweep = || analyzer_event(&s, json!({ "entrega_task": "sweep" }));
    let report = sweep().await;
    assert_eq!(report["requeued"], 1, "{report}");
    assert!(
        due_indexed(&stack, &lost_id).await,
        "the sweep's scan indexed the one still waiting"
    );
    let again = sweep().await;
    assert_eq!(
        again["requeued"], 0,
        "queued once, not on every run: {again}"
    );

    stack.start_pollers();
    eventually(Duration::from_secs(60), "both delivered", || async {
        (receiver.count() >= 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.count(), 2, "each delivered once");
    assert_eq!(receiver.distinct_webhook_ids().len(), 2);
    let delivered = s.store.get_delivery(&lost_id).await.unwrap().unwrap();
    assert_eq!(delivered.state, DeliveryState::Delivered);

    // Delivered deliveries leave the sweeper's index: a later sweep finds nothing.
    clock.advance(Duration::from_secs(3_600));
    let later = sweep().await;
    assert_eq!(later["examined"], 0, "{later}");
}

/// Whether the delivery item `id` has its due index entry (read from the table: the
/// index is KEYS_ONLY, its key attributes are the item's).
async fn due_indexed(stack: &Stack, id: &DeliveryId) -> bool {
    let (pk, sk) = keys::delivery(id);
    aws_sdk_dynamodb::Client::new(&stack.sdk)
        .get_item()
        .table_name(&stack.resources.main_table)
        .key(PK, AttributeValue::S(pk))
        .key(SK, AttributeValue::S(sk))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .expect("the delivery item")
        .contains_key(keys::BY_DUE.pk)
}

/// Deliveries left out of the due index while young are all found by the sweeper's
/// scan, however few one run may index: each run goes on where the last stopped, a
/// settled one is never indexed, and none is missed.
#[tokio::test(flavor = "multi_thread")]
async fn the_scan_finds_every_waiting_delivery_over_bounded_runs() {
    use entrega_core::delivery::Delivery;
    use entrega_core::handlers::sweep::SWEEP_GRACE;
    use entrega_core::ports::{Clock, DeliveryStore};
    use std::collections::HashSet;

    let clock = Arc::new(ManualClock::new(Utc::now()));
    let stack = Stack::provisioned(clock.clone()).await;
    let store = entrega_aws::resources::dynamo_store(&stack.sdk, &stack.resources, clock.clone())
        .with_left_out_per_shard(1);
    let s = &stack.services;
    let tenant = tenant(s).await;
    let ep = endpoint(
        s,
        &tenant,
        "https://hooks.example.com/".into(),
        RetrySpec::default(),
    )
    .await;
    let mut waiting = HashSet::new();
    for i in 0..200 {
        let e = event(s, &tenant, "a.b", "{}");
        let id = DeliveryId::for_event(&e.id, &ep.id, e.created_at.timestamp_millis());
        let (mut d, _) = store
            .create_delivery_if_absent(&Delivery::new(id, &e, ep.id.clone(), false, clock.now()))
            .await
            .unwrap();
        if i % 10 == 0 {
            d.state = DeliveryState::Delivered;
            d.next_attempt_at = None;
            store.save_delivery(&d, &[]).await.unwrap();
        } else {
            assert!(!due_indexed(&stack, &d.id).await);
            waiting.insert(d.id);
        }
    }

    clock.advance(Duration::from_secs(30 * 60));
    let before = clock.now() - SWEEP_GRACE;
    let mut runs = 0;
    loop {
        runs += 1;
        store.prepare_sweep(before).await.unwrap();
        let found: HashSet<DeliveryId> = store
            .overdue_deliveries(before, 1_000)
            .await
            .unwrap()
            .into_iter()
            .map(|d| d.id)
            .collect();
        assert!(found.is_subset(&waiting), "only waiting ones are found");
        if found == waiting {
            break;
        }
        assert!(
            runs < 30,
            "run {runs} found {} of {}",
            found.len(),
            waiting.len()
        );
    }
    assert!(
        runs > 1,
        "180 waiting over 64 shards, one a shard a run, take more than one run"
    );
}
