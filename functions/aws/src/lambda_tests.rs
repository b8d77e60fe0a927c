//! The outbox trigger's batching of delivery messages, on the in-memory world.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{TimeZone, Utc};
use entrega_core::event::{format_timestamp, Event};
use entrega_core::ids::{EventId, TenantId};
use entrega_core::memory::World;
use entrega_core::ports::{
    Backlog, Clock, Hooked, MessageQueue, OutgoingMessage, SendHook, StoreError, StoreResult,
};
use serde_json::json;

use super::*;

/// The delivery queue, counting send calls and refusing them when told.
struct Counted {
    queue: Arc<dyn MessageQueue>,
    calls: AtomicUsize,
    /// Send calls from this one on (1-based) fail.
    refuse_from: AtomicUsize,
}

#[async_trait]
impl SendHook for Counted {
    fn queue(&self) -> &dyn MessageQueue {
        self.queue.as_ref()
    }

    async fn send(&self, messages: Vec<OutgoingMessage>) -> StoreResult<()> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if call >= self.refuse_from.load(Ordering::SeqCst) {
            return Err(StoreError::Backend("queue unavailable".into()));
        }
        self.queue.send(messages).await
    }
}

/// A backlog that sums what it is told, counting the calls.
#[derive(Default)]
struct Tally {
    calls: AtomicUsize,
    waiting: Mutex<i64>,
}

#[async_trait]
impl Backlog for Tally {
    async fn tenant_backlog(&self, _: &TenantId) -> StoreResult<u64> {
        Ok((*self.waiting.lock().unwrap()).max(0) as u64)
    }
    async fn record(&self, _: &TenantId, delta: i64) -> StoreResult<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        *self.waiting.lock().unwrap() += delta;
        Ok(())
    }
}

/// A world with one tenant, one endpoint and `n` published events, their stream
/// records numbered 1..=n, and the counted queue and backlog in the services.
struct Published {
    world: World,
    queue: Arc<Hooked<Counted>>,
    backlog: Arc<Tally>,
    events: Vec<Event>,
    records: Vec<OutboxRecord>,
}

async fn published(n: usize) -> Published {
    let mut world = World::new(Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap(), 3);
    let tenant = world
        .add_tenant(TenantId::generate(), "Acme", "owner@acme.example")
        .await
        .unwrap();
    world
        .add_endpoint(&tenant, "https://hooks.acme.example/", |_| {})
        .await
        .unwrap();
    let counted = Arc::new(Hooked(Counted {
        queue: world.services.deliveries.clone(),
        calls: AtomicUsize::new(0),
        refuse_from: AtomicUsize::new(usize::MAX),
    }));
    world.services.deliveries = counted.clone();
    let backlog = Arc::new(Tally::default());
    world.services.backlog = backlog.clone();
    let mut events = Vec::new();
    let mut records = Vec::new();
    for i in 1..=n {
        let event = Event {
            id: EventId::generate(),
            tenant_id: tenant.clone(),
            event_type: "invoice.paid".into(),
            payload: "{}".into(),
            created_at: world.clock.now(),
        };
        world.services.store.publish(&event).await.unwrap();
        records.push(OutboxRecord {
            sequence_number: format!("{i:03}"),
            event_name: "INSERT".into(),
            new_image: json!({
                "pk": {"S": event.id.as_str()}, "tenant_id": {"S": tenant.as_str()},
                "type": {"S": "invoice.paid"}, "payload": {"S": "{}"},
                "created_at": {"S": format_timestamp(event.created_at)}
            }),
        });
        events.push(event);
    }
    Published {
        world,
        queue: counted,
        backlog,
        events,
        records,
    }
}

/// Each of `events` has one delivery, however often it was fanned out.
async fn one_delivery_each(world: &World, events: &[Event]) {
    for event in events {
        let made = world
            .services
            .store
            .deliveries_of_event(event)
            .await
            .unwrap();
        assert_eq!(made.len(), 1, "one delivery for event {}", event.id);
    }
}

/// The records a response asks Lambda to replay from.
fn failed_from(response: &DynamoDbEventResponse) -> Vec<String> {
    response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone().unwrap_or_default())
        .collect()
}

fn quarantine(world: &World) -> Arc<dyn MessageQueue> {
    world.services.failures.clone()
}

#[tokio::test]
async fn a_batchs_messages_go_ten_to_a_send() {
    let Published {
        world,
        queue: counted,
        backlog: tally,
        events,
        records,
    } = published(23).await;
    let response = outbox_batch(&world.services, quarantine(&world).as_ref(), records).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(
        counted.calls.load(Ordering::SeqCst),
        3,
        "23 messages in three sends (10, 10, 3), not 23"
    );
    assert_eq!(world.deliveries.len(), 23, "every event's message queued");
    assert_eq!(*tally.waiting.lock().unwrap(), 23);
    assert_eq!(
        tally.calls.load(Ordering::SeqCst),
        1,
        "one backlog update for the tenant, not one per event"
    );
    one_delivery_each(&world, &events).await;
}

#[tokio::test]
async fn a_failed_send_replays_from_the_first_record_it_held() {
    let Published {
        world,
        queue: counted,
        events,
        records,
        ..
    } = published(13).await;
    // The first send (records 1..=10) goes out; the second (11..=13) fails.
    counted.refuse_from.store(2, Ordering::SeqCst);
    let response = outbox_batch(
        &world.services,
        quarantine(&world).as_ref(),
        records.clone(),
    )
    .await;
    let failures = failed_from(&response);
    assert_eq!(
        failures,
        ["011"],
        "Lambda replays from the first record whose message was not sent"
    );
    assert_eq!(world.deliveries.len(), 10, "the first ten were sent");

    // Lambda's retry from record 11: the fan-out finds those deliveries never
    // attempted and queues them again; nothing is made twice.
    counted.refuse_from.store(usize::MAX, Ordering::SeqCst);
    let response = outbox_batch(
        &world.services,
        quarantine(&world).as_ref(),
        records[10..].to_vec(),
    )
    .await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(
        world.deliveries.len(),
        13,
        "each event's message queued once"
    );
    one_delivery_each(&world, &events).await;
}

#[tokio::test]
async fn a_delivery_batch_moves_each_tenants_backlog_once() {
    let Published {
        world,
        backlog: tally,
        records,
        ..
    } = published(7).await;
    outbox_batch(&world.services, quarantine(&world).as_ref(), records).await;
    let received = world
        .services
        .deliveries
        .receive(10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(received.len(), 7);
    let event: SqsEvent = serde_json::from_value(json!({ "Records": received
        .iter()
        .map(|m| json!({
            "messageId": m.receipt, "receiptHandle": m.receipt, "body": m.body,
            "attributes": {"ApproximateReceiveCount": m.receive_count.to_string()},
            "messageAttributes": {}
        }))
        .collect::<Vec<_>>() }))
    .unwrap();
    let response = delivery_batch(&world.services, event).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(world.transport.requests().len(), 7, "every delivery sent");
    assert_eq!(
        *tally.waiting.lock().unwrap(),
        0,
        "all seven left the backlog"
    );
    assert_eq!(
        tally.calls.load(Ordering::SeqCst),
        2,
        "one update at fan-out and one for the delivery batch"
    );
}

#[tokio::test]
async fn a_first_send_that_fails_replays_the_whole_batch() {
    let Published {
        world,
        queue,
        records,
        ..
    } = published(13).await;
    queue.refuse_from.store(1, Ordering::SeqCst);
    let response = outbox_batch(&world.services, quarantine(&world).as_ref(), records).await;
    let failures = failed_from(&response);
    assert_eq!(failures, ["001"], "nothing was sent: from the first record");
    assert!(world.deliveries.is_empty());
}

/// Records 1-3 good, 4 malformed, 5-6 good.
fn with_a_malformed_fourth(records: &[OutboxRecord]) -> Vec<OutboxRecord> {
    let mut mixed = records[..3].to_vec();
    mixed.push(OutboxRecord {
        sequence_number: "004".into(),
        event_name: "INSERT".into(),
        new_image: json!({"pk": {"S": "no.type"}}),
    });
    mixed.extend(records[3..5].iter().cloned().enumerate().map(|(i, mut r)| {
        r.sequence_number = format!("{:03}", i + 5);
        r
    }));
    mixed
}

#[tokio::test]
async fn a_malformed_item_is_quarantined_once_after_what_came_before_is_sent() {
    let Published {
        world,
        queue,
        records,
        ..
    } = published(5).await;
    let parked = world.failures.clone();
    let response = outbox_batch(
        &world.services,
        quarantine(&world).as_ref(),
        with_a_malformed_fourth(&records),
    )
    .await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(parked.len(), 1, "quarantined");
    assert_eq!(world.deliveries.len(), 5);
    assert_eq!(
        queue.calls.load(Ordering::SeqCst),
        2,
        "the three before it sent first, then the two after"
    );

    // The send before the quarantine fails: the batch replays from the first record,
    // and the malformed item is not quarantined yet (the replay will, once).
    let Published {
        world,
        queue,
        records,
        ..
    } = published(5).await;
    queue.refuse_from.store(1, Ordering::SeqCst);
    let parked = world.failures.clone();
    let response = outbox_batch(
        &world.services,
        quarantine(&world).as_ref(),
        with_a_malformed_fourth(&records),
    )
    .await;
    let failures = failed_from(&response);
    assert_eq!(failures, ["001"]);
    assert!(parked.is_empty(), "not quarantined before the replay");
}

#[tokio::test]
async fn a_batchs_records_are_fanned_out_ten_at_once() {
    let Published {
        world,
        queue,
        events,
        records,
        ..
    } = published(25).await;
    world.store.yield_in_delivery_creates();
    let response = outbox_batch(&world.services, quarantine(&world).as_ref(), records).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(
        world.store.most_creates_under_way(),
        FAN_OUTS_AT_ONCE,
        "a group's fan-outs wait for the store together, and no more than a group"
    );
    assert_eq!(world.deliveries.len(), 25, "every event's message queued");
    assert_eq!(
        queue.calls.load(Ordering::SeqCst),
        3,
        "a group's messages in one send (10, 10, 5)"
    );
    one_delivery_each(&world, &events).await;
}

#[tokio::test]
async fn a_batch_reads_each_tenants_endpoints_once() {
    let Published { world, records, .. } = published(23).await;
    let before = world.store.endpoint_list_reads();
    let response = outbox_batch(&world.services, quarantine(&world).as_ref(), records).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(world.deliveries.len(), 23);
    assert_eq!(
        world.store.endpoint_list_reads() - before,
        1,
        "23 events of one tenant: its endpoints read once, not once an event"
    );
}

#[tokio::test]
async fn a_record_failing_in_a_group_replays_the_batch_from_it() {
    let Published {
        world,
        events,
        records,
        ..
    } = published(10).await;
    world.store.yield_in_delivery_creates();
    world
        .store
        .fail_creates_for_event(Some(events[3].id.clone()));
    let response = outbox_batch(
        &world.services,
        quarantine(&world).as_ref(),
        records.clone(),
    )
    .await;
    assert_eq!(
        failed_from(&response),
        ["004"],
        "Lambda replays from the failed record, the first of its group to fail"
    );
    assert_eq!(
        world.deliveries.len(),
        9,
        "the others in its group were fanned out and their messages sent"
    );

    world.store.fail_creates_for_event(None);
    let response = outbox_batch(
        &world.services,
        quarantine(&world).as_ref(),
        records[3..].to_vec(),
    )
    .await;
    assert!(response.batch_item_failures.is_empty());
    one_delivery_each(&world, &events).await;
    let queued: std::collections::HashSet<String> = world
        .deliveries
        .bodies()
        .iter()
        .map(|body| serde_json::from_str::<Value>(body).unwrap()["delivery_id"].to_string())
        .collect();
    assert_eq!(queued.len(), 10, "every event's delivery queued");
}
