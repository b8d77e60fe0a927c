//! An endpoint's concurrency cap across Lambda invocations: two batches handled at
//! once, as two concurrent invocations would, never send more than the cap together.

use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::SqsEvent;
use entrega_aws::lambda::delivery_batch;
use entrega_core::endpoint::Endpoint;
use entrega_core::handlers::fanout::fan_out;
use entrega_core::ids::TenantId;
use entrega_core::ports::{Services, SystemClock};
use entrega_core::retry::RetrySpec;
use entrega_core::slots::SlotPool;
use entrega_testkit::{eventually, Receiver, Reply};
use serde_json::json;

use crate::harness::Stack;
use crate::support::*;

/// Lambda's SQS event for received messages, each received `receives` times.
fn sqs_event(stack: &Stack, messages: &[aws_sdk_sqs::types::Message], receives: u32) -> SqsEvent {
    let records: Vec<_> = messages
        .iter()
        .map(|m| {
            json!({
                "messageId": m.message_id().unwrap(),
                "receiptHandle": m.receipt_handle().unwrap(),
                "body": m.body().unwrap(),
                "attributes": {"ApproximateReceiveCount": receives.to_string()},
                "messageAttributes": {}, "md5OfBody": "0", "eventSource": "aws:sqs",
                "eventSourceARN": stack.resources.delivery_queue_arn, "awsRegion": "us-east-1"
            })
        })
        .collect();
    serde_json::from_value(json!({ "Records": records })).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cap_holds_across_two_concurrent_batches() {
    const CAP: u32 = 2;
    let mut stack = Stack::provisioned(Arc::new(SystemClock)).await;
    let s = stack.services.clone();
    let tenant = tenant(&s).await;
    let receiver = Receiver::start(
        vec![],
        Reply::status(204).after(Duration::from_millis(1500)),
    )
    .await;
    let ep = Endpoint {
        max_concurrency: CAP,
        ..Endpoint::new(tenant.clone(), receiver.url("/"), s.clock.now())
    };
    s.store
        .create_endpoint(&ep, entrega_core::endpoint::MAX_ENDPOINTS_PER_TENANT)
        .await
        .unwrap();
    for i in 0..6 {
        let e = event(&s, &tenant, "a.b", &format!(r#"{{"n":{i}}}"#));
        s.store.publish(&e).await.unwrap();
        fan_out(&s, &e).await.unwrap();
    }
    let sqs = aws_sdk_sqs::Client::new(&stack.sdk);
    let mut messages = Vec::new();
    while messages.len() < 6 {
        let out = sqs
            .receive_message()
            .queue_url(&stack.resources.delivery_queue_url)
            .max_number_of_messages(10)
            .visibility_timeout(120)
            .send()
            .await
            .unwrap();
        messages.extend(out.messages().iter().cloned());
    }
    let (first, second) = messages.split_at(3);

    // Two invocations at once, three messages each, to an endpoint that takes two.
    let (a, b) = tokio::join!(
        delivery_batch(&s, sqs_event(&stack, first, 1)),
        delivery_batch(&s, sqs_event(&stack, second, 1)),
    );
    assert_eq!(
        receiver.peak_in_flight(),
        CAP as usize,
        "never more than the cap"
    );
    assert_eq!(
        receiver.count(),
        CAP as usize,
        "the cap's worth sent at once"
    );
    // The rest were hidden for a moment (reported failed, so Lambda keeps them), not
    // waited for inside the invocation.
    assert_eq!(
        a.batch_item_failures.len() + b.batch_item_failures.len(),
        6 - CAP as usize
    );

    // The event source mapping brings them back; every one is delivered once, and the
    // cap still holds.
    stack.start_pollers();
    eventually(Duration::from_secs(60), "all six delivered", || async {
        (receiver.count() >= 6).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.distinct_webhook_ids().len(), 6);
    assert_eq!(receiver.count(), 6, "each delivered once");
    assert_eq!(receiver.peak_in_flight(), CAP as usize);
}

/// A message that has waited many receives for a busy endpoint is sent again (its
/// receive count starts over) instead of being hidden once more: waiting for a slot
/// never walks it into the dead-letter queue.
#[tokio::test(flavor = "multi_thread")]
async fn a_long_wait_for_a_slot_is_sent_again_not_dead_lettered() {
    let stack = Stack::provisioned(Arc::new(SystemClock)).await;
    let s = stack.services.clone();
    let tenant = tenant(&s).await;
    let receiver = Receiver::answering(204).await;
    let ep = Endpoint {
        max_concurrency: 1,
        ..Endpoint::new(tenant.clone(), receiver.url("/"), s.clock.now())
    };
    s.store
        .create_endpoint(&ep, entrega_core::endpoint::MAX_ENDPOINTS_PER_TENANT)
        .await
        .unwrap();
    let e = event(&s, &tenant, "a.b", "{}");
    s.store.publish(&e).await.unwrap();
    fan_out(&s, &e).await.unwrap();
    let sqs = aws_sdk_sqs::Client::new(&stack.sdk);
    let queue = &stack.resources.delivery_queue_url;
    let received = sqs.receive_message().queue_url(queue).send().await.unwrap();
    let message = received.messages().to_vec();
    assert_eq!(message.len(), 1);
    // Another invocation holds the endpoint's only slot.
    let held = s
        .slots
        .acquire(
            &SlotPool::Endpoint(ep.id.clone()),
            1,
            "other",
            s.clock.now(),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert!(held.is_some());

    let early = delivery_batch(&s, sqs_event(&stack, &message, 2)).await;
    assert_eq!(early.batch_item_failures.len(), 1, "hidden briefly, kept");
    let late = delivery_batch(&s, sqs_event(&stack, &message, 25)).await;
    assert!(
        late.batch_item_failures.is_empty(),
        "done with (Lambda deletes it): a fresh copy carries on"
    );
    let fresh = eventually(Duration::from_secs(60), "the fresh copy", || async {
        let out = sqs
            .receive_message()
            .queue_url(queue)
            .message_system_attribute_names(
                aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount,
            )
            .send()
            .await
            .unwrap();
        out.messages()
            .iter()
            .find(|m| m.message_id() != message[0].message_id())
            .cloned()
    })
    .await;
    assert_eq!(fresh.body(), message[0].body(), "the same task");
    assert_eq!(receiver.count(), 0, "nothing sent while the slot was taken");
}

/// `serve --backend aws` hands the delivery queue's batches to several invocations at
/// once, as Lambda does: one tenant's endpoint that hangs holds its own batch, not
/// the messages of the tenants behind it.
#[tokio::test(flavor = "multi_thread")]
async fn a_hanging_endpoint_holds_its_own_batch_not_another_tenants() {
    const HANG: Duration = Duration::from_secs(40);
    let stack = Stack::start().await;
    let s = stack.services.clone();
    let slow_tenant = tenant(&s).await;
    let hanging = Receiver::start(vec![], Reply::status(200).after(HANG)).await;
    let slow = endpoint(&s, &slow_tenant, hanging.url("/slow"), RetrySpec::default()).await;
    let slow = s
        .store
        .update_endpoint(&Endpoint {
            timeout_ms: 30_000,
            ..slow
        })
        .await
        .unwrap();
    // The attempts end at the endpoint's timeout: the other tenant's event must come
    // well before that.
    let timeout = Duration::from_millis(u64::from(slow.timeout_ms));
    assert!(timeout < HANG && slow.max_concurrency >= 3);
    publish_numbered(&s, &slow_tenant, 3).await;
    eventually(Duration::from_secs(30), "the hanging attempts", || async {
        (hanging.count() == 3).then_some(())
    })
    .await;

    let arrived = another_tenants_event_arrives(&s, timeout / 2).await;
    assert_eq!(
        hanging.count(),
        3,
        "the hanging attempts are still the only ones"
    );
    println!("the other tenant's event arrived {arrived:?} after it was published");
}

/// Publish `count` events for `tenant`, numbered in their data.
async fn publish_numbered(s: &Services, tenant: &TenantId, count: usize) {
    for n in 0..count {
        let e = event(s, tenant, "order.created", &format!(r#"{{"n":{n}}}"#));
        s.store.publish(&e).await.unwrap();
    }
}

/// Until `share` attempts hang at `hanging`.
async fn share_taken(hanging: &Receiver, share: usize) {
    eventually(Duration::from_secs(20), "the share taken", || async {
        (hanging.count() >= share).then_some(())
    })
    .await;
}

/// The most attempts that were in flight at once at `hanging`, and how many came,
/// after `settle` more for every message to be received (past the share, the rest
/// wait hidden), and still before the first hanging attempt's timeout (30 s from its
/// arrival) could free a place.
async fn settled_peak(hanging: &Receiver, settle: Duration) -> (usize, usize) {
    tokio::time::sleep(settle).await;
    let (peak, count) = (hanging.peak_in_flight(), hanging.count());
    let first = hanging.got().first().map(|r| r.at).expect("attempts came");
    assert!(
        first.elapsed() < Duration::from_secs(29),
        "too slow to tell: an attempt may have timed out and freed its place"
    );
    (peak, count)
}

/// A new tenant's event to an endpoint answering at once arrives `within` of its
/// publishing, while others hang; how long it took.
async fn another_tenants_event_arrives(s: &Services, within: Duration) -> Duration {
    let other_tenant = tenant(s).await;
    let quick = Receiver::answering(204).await;
    endpoint(s, &other_tenant, quick.url("/quick"), RetrySpec::default()).await;
    let published = Instant::now();
    let theirs = event(s, &other_tenant, "order.created", "{}");
    s.store.publish(&theirs).await.unwrap();
    eventually(
        within,
        "the other tenant's event, while others hang",
        || async { (quick.count() == 1).then_some(()) },
    )
    .await;
    assert_eq!(quick.got()[0].header("webhook-id"), theirs.id.as_str());
    published.elapsed()
}

/// Endpoints slow lately hold at most the slow share of the worker together, however
/// many of them hang and however many messages wait for them, so the other
/// invocations stay free for the tenants whose endpoints answer.
#[tokio::test(flavor = "multi_thread")]
async fn endpoints_that_hang_hold_at_most_the_slow_share_together() {
    const HANGING_ENDPOINTS: usize = 20;
    const EVENTS_EACH: usize = 4;
    const SHARE: usize = entrega_aws::emulation::SLOW_ENDPOINT_SHARE as usize;
    let stack = Stack::start().await;
    let s = stack.services.clone();
    // One receiver behind every hanging endpoint: its peak of requests in flight is
    // theirs together, while none has reached its timeout (30 s; it answers later).
    let hanging = Receiver::start(vec![], Reply::status(200).after(Duration::from_secs(90))).await;
    let mut slow = Vec::new();
    for i in 0..HANGING_ENDPOINTS {
        let t = tenant(&s).await;
        let ep = endpoint(&s, &t, hanging.url(&format!("/h{i}")), RetrySpec::default()).await;
        let ep = s
            .store
            .update_endpoint(&Endpoint {
                timeout_ms: entrega_core::endpoint::MAX_TIMEOUT_MS,
                ..ep
            })
            .await
            .unwrap();
        // Slow lately (an earlier attempt timed out; `attempt_slots_tests` covers the mark).
        let now = s.clock.now();
        let marked = entrega_core::endpoint_health::mark_slow(&ep.health, now).unwrap();
        s.store
            .update_endpoint_health(&ep.id, &marked)
            .await
            .unwrap();
        slow.push(t);
    }
    // Their caps (8 each) would let 80 attempts hang, ten times the share. (Not more:
    // the fan-out hands the worker all of them at once, and on the emulator, which
    // serves DynamoDB one request at a time, the messages waiting for the share took
    // the test's 30 s.)
    let started = Instant::now();
    for n in 0..EVENTS_EACH {
        for t in &slow {
            let e = event(&s, t, "order.created", &format!(r#"{{"n":{n}}}"#));
            s.store.publish(&e).await.unwrap();
        }
    }
    share_taken(&hanging, SHARE).await;
    let (peak, count) = settled_peak(&hanging, Duration::from_secs(4)).await;
    println!(
        "{count} attempts at the hanging endpoints, at most {peak} at once, {:?} after publishing",
        started.elapsed()
    );
    assert_eq!(peak, SHARE, "slow endpoints hold the share, and no more");
}

/// An endpoint that starts hanging is marked slow only when an attempt ends, a timeout
/// later. Until then its attempts hold at most one endpoint's share of the pollers,
/// whatever its own cap, so another tenant's event still goes at once.
#[tokio::test(flavor = "multi_thread")]
async fn an_endpoint_that_starts_hanging_holds_one_share_of_the_pollers() {
    const EVENTS: usize = 40;
    const SHARE: usize = entrega_aws::emulation::ONE_ENDPOINT_SHARE as usize;
    let stack = Stack::start().await;
    let s = stack.services.clone();
    let hanging_tenant = tenant(&s).await;
    let hanging = Receiver::start(vec![], Reply::status(200).after(Duration::from_secs(90))).await;
    let ep = endpoint(
        &s,
        &hanging_tenant,
        hanging.url("/new"),
        RetrySpec::default(),
    )
    .await;
    // Never slow before, and a cap (64) past the pollers (16): it alone could hold
    // every one of them for its first timeout.
    let ep = s
        .store
        .update_endpoint(&Endpoint {
            timeout_ms: entrega_core::endpoint::MAX_TIMEOUT_MS,
            max_concurrency: 64,
            ..ep
        })
        .await
        .unwrap();
    assert!(!ep.health.is_slow(s.clock.now()));
    publish_numbered(&s, &hanging_tenant, EVENTS).await;
    share_taken(&hanging, SHARE).await;
    let arrived = another_tenants_event_arrives(&s, Duration::from_secs(10)).await;
    let (peak, count) = settled_peak(&hanging, Duration::from_secs(3)).await;
    println!("{count} attempts at the new hanging endpoint, at most {peak} at once; the other tenant's event arrived {arrived:?} after it was published");
    assert_eq!(peak, SHARE, "one endpoint holds its share, and no more");
}
