//! The sweeper on AWS, through the dlq-analyzer's entry point as its schedule calls it:
//! a delivery whose message vanished is queued again and delivered once.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
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
    let id = DeliveryId::for_event(&lost.id, &ep.id, lost.created_at.timestamp_millis());
    let delivered = s.store.get_delivery(&id).await.unwrap().unwrap();
    assert_eq!(delivered.state, DeliveryState::Delivered);

    // Delivered deliveries leave the sweeper's index: a later sweep finds nothing.
    clock.advance(Duration::from_secs(3_600));
    let later = sweep().await;
    assert_eq!(later["examined"], 0, "{later}");
}
