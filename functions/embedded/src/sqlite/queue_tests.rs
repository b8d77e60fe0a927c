//! The queue's SQS-like semantics, fairness and caps, on a real SQLite file under a
//! manual clock.

use std::sync::Arc;
use std::time::Duration;

use chrono::TimeZone;
use entrega_core::ports::{ManualClock, MessageQueue, OutgoingMessage};

use super::*;

struct Fixture {
    _dir: PathGuard,
    clock: Arc<ManualClock>,
    queue: SqliteQueue,
}

struct PathGuard(std::path::PathBuf);

impl Drop for PathGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn fixture() -> Fixture {
    let dir = std::env::temp_dir().join(format!("entrega-queue-{}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = SqliteDb::open(&dir.join("q.db")).unwrap();
    let clock = Arc::new(ManualClock::new(
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap(),
    ));
    let queue = SqliteQueue::open(db, DELIVERY_QUEUE, clock.clone())
        .await
        .unwrap();
    Fixture {
        _dir: PathGuard(dir),
        clock,
        queue,
    }
}

fn msg(group: &str, key: &str, limit: u32, body: &str) -> OutgoingMessage {
    OutgoingMessage {
        body: body.into(),
        group: group.into(),
        delay: Duration::ZERO,
        concurrency_key: Some(key.into()),
        concurrency_limit: limit,
    }
}

const VISIBILITY: Duration = Duration::from_secs(60);

#[tokio::test]
async fn unacknowledged_messages_come_back_after_the_visibility_timeout() {
    let f = fixture().await;
    f.queue.send(vec![msg("t1", "e1", 8, "a")]).await.unwrap();
    let first = f.queue.receive(10, VISIBILITY).await.unwrap();
    assert_eq!((first.len(), first[0].receive_count), (1, 1));
    assert!(
        f.queue.receive(10, VISIBILITY).await.unwrap().is_empty(),
        "hidden while in flight"
    );
    f.clock.advance(VISIBILITY + Duration::from_secs(1));
    let again = f.queue.receive(10, VISIBILITY).await.unwrap();
    assert_eq!((again.len(), again[0].receive_count), (1, 2));
    // The first receipt is stale: deleting with it does nothing.
    f.queue.delete(&first[0].receipt).await.unwrap();
    assert_eq!(f.queue.depth().await.unwrap(), 1);
    f.queue.delete(&again[0].receipt).await.unwrap();
    assert_eq!(f.queue.depth().await.unwrap(), 0);
}

#[tokio::test]
async fn delays_and_visibility_changes_are_honoured() {
    let f = fixture().await;
    let mut later = msg("t1", "e1", 8, "later");
    later.delay = Duration::from_secs(30 * 3600);
    f.queue
        .send(vec![later, msg("t1", "e1", 8, "now")])
        .await
        .unwrap();
    let got = f.queue.receive(10, VISIBILITY).await.unwrap();
    assert_eq!(
        got.iter().map(|m| m.body.as_str()).collect::<Vec<_>>(),
        ["now"]
    );
    f.queue
        .change_visibility(&got[0].receipt, Duration::from_secs(5))
        .await
        .unwrap();
    f.clock.advance(Duration::from_secs(4));
    assert!(f.queue.receive(10, VISIBILITY).await.unwrap().is_empty());
    f.clock.advance(Duration::from_secs(1));
    assert_eq!(
        f.queue.receive(10, VISIBILITY).await.unwrap()[0].body,
        "now"
    );
    f.clock.advance(Duration::from_secs(30 * 3600));
    let bodies: Vec<_> = f
        .queue
        .receive(10, VISIBILITY)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.body)
        .collect();
    assert!(
        bodies.contains(&"later".to_owned()),
        "a 30-hour delay is just later visibility"
    );
}

#[tokio::test]
async fn receiving_is_round_robin_across_tenants() {
    let f = fixture().await;
    let flood: Vec<_> = (0..100)
        .map(|i| msg("big", &format!("e{i}"), 8, "big"))
        .collect();
    f.queue.send(flood).await.unwrap();
    f.queue
        .send(vec![
            msg("small1", "s1", 8, "s1"),
            msg("small2", "s2", 8, "s2"),
        ])
        .await
        .unwrap();
    let got = f.queue.receive(3, VISIBILITY).await.unwrap();
    let mut bodies: Vec<_> = got.iter().map(|m| m.body.as_str()).collect();
    bodies.sort();
    assert_eq!(
        bodies,
        ["big", "s1", "s2"],
        "one per tenant before a second from any"
    );
    // The next receive starts after the group served last: the flood's tenant.
    let next = f.queue.receive(2, VISIBILITY).await.unwrap();
    assert_eq!(next.len(), 2);
}

#[tokio::test]
async fn an_endpoint_never_has_more_than_its_cap_in_flight() {
    let f = fixture().await;
    let blocked: Vec<_> = (0..50).map(|_| msg("t1", "slow", 3, "slow")).collect();
    f.queue.send(blocked).await.unwrap();
    f.queue
        .send(vec![msg("t1", "other", 8, "other")])
        .await
        .unwrap();
    let got = f.queue.receive(20, VISIBILITY).await.unwrap();
    let slow = got.iter().filter(|m| m.body == "slow").count();
    assert_eq!(slow, 3, "capped at 3");
    assert!(
        got.iter().any(|m| m.body == "other"),
        "the same tenant's other endpoint still flows"
    );
    assert!(
        f.queue.receive(20, VISIBILITY).await.unwrap().is_empty(),
        "cap full"
    );
    // A retry delay frees the slot; a delete frees it too.
    let slow_msgs: Vec<_> = got.iter().filter(|m| m.body == "slow").collect();
    f.queue
        .change_visibility(&slow_msgs[0].receipt, Duration::from_secs(600))
        .await
        .unwrap();
    f.queue.delete(&slow_msgs[1].receipt).await.unwrap();
    assert_eq!(f.queue.receive(20, VISIBILITY).await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_reopened_queue_forgets_what_was_in_flight_but_keeps_delays() {
    let f = fixture().await;
    f.queue
        .send(vec![
            msg("t1", "e1", 8, "in flight"),
            msg("t1", "e1", 8, "retry"),
        ])
        .await
        .unwrap();
    let got = f.queue.receive(2, VISIBILITY).await.unwrap();
    let retry = got.iter().find(|m| m.body == "retry").unwrap();
    f.queue
        .change_visibility(&retry.receipt, Duration::from_secs(600))
        .await
        .unwrap();
    // A new process on the same file: the in-flight message is visible at once (its
    // consumer died with the old process), the delayed one keeps its delay.
    let reopened = SqliteQueue::open(f.queue.db.clone(), DELIVERY_QUEUE, f.clock.clone())
        .await
        .unwrap();
    let again = reopened.receive(10, VISIBILITY).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].body, "in flight");
    assert!(
        reopened.delete(&got[0].receipt).await.is_ok(),
        "an old process's receipt is stale, not an error"
    );
    assert_eq!(reopened.depth().await.unwrap(), 2);
    f.clock.advance(Duration::from_secs(600));
    let later: Vec<String> = reopened
        .receive(10, VISIBILITY)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.body)
        .collect();
    assert!(later.contains(&"retry".to_owned()), "{later:?}");
}

#[tokio::test]
async fn fifty_thousand_queued_behind_a_saturated_endpoint_do_not_delay_its_neighbour() {
    let f = fixture().await;
    let backlog: Vec<_> = (0..50_000).map(|_| msg("t1", "slow", 1, "slow")).collect();
    f.queue.send(backlog).await.unwrap();
    let first = f.queue.receive(64, VISIBILITY).await.unwrap();
    assert_eq!(first.len(), 1, "the slow endpoint's cap of 1 holds");
    f.queue
        .send(vec![msg("t1", "fast", 8, "fast")])
        .await
        .unwrap();
    let next = f.queue.receive(64, VISIBILITY).await.unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!(
        next[0].body, "fast",
        "the same tenant's other endpoint is served at once"
    );
    assert_eq!(f.queue.group_len("t1"), 50_001);
}

/// The store conformance suite, on a real SQLite file.
mod conformance {
    use entrega_testkit::conformance::*;

    use super::*;
    use crate::sqlite::SqliteStore;

    async fn store() -> (PathGuard, SqliteStore) {
        let dir = std::env::temp_dir().join(format!("entrega-conf-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = SqliteDb::open(&dir.join("c.db")).unwrap();
        let store = SqliteStore::new(db, Arc::new(entrega_core::ports::SystemClock));
        (PathGuard(dir), store)
    }

    #[tokio::test]
    async fn sqlite_store_conforms() {
        let (_dir, store) = store().await;
        every_promise(&store).await;
    }

    #[tokio::test]
    async fn sqlite_queue_conforms() {
        let dirs = std::sync::Mutex::new(Vec::new());
        every_queue_promise(
            || async {
                let dir =
                    std::env::temp_dir().join(format!("entrega-confq-{}", rand::random::<u64>()));
                std::fs::create_dir_all(&dir).unwrap();
                let db = SqliteDb::open(&dir.join("q.db")).unwrap();
                dirs.lock().unwrap().push(PathGuard(dir));
                let clock = Arc::new(entrega_core::ports::SystemClock);
                let queue = SqliteQueue::open(db, DELIVERY_QUEUE, clock).await.unwrap();
                Arc::new(queue) as Arc<dyn MessageQueue>
            },
            entrega_testkit::conformance::StaleReceipts::Ignored,
        )
        .await;
    }

    #[tokio::test]
    async fn in_process_slots_conform() {
        endpoint_slots_cap_each_endpoint(&entrega_core::slots::InProcessSlots::default()).await;
        // Layered over another adapter, the promises still hold.
        endpoint_slots_cap_each_endpoint(&entrega_core::slots::LocalFirstSlots::new(
            entrega_core::slots::InProcessSlots::default(),
        ))
        .await;
    }
}
