//! The in-memory adapters pass the same conformance suites as the real ones.

use std::sync::Arc;

use entrega_core::memory::MemoryQueue;
use entrega_core::ports::{MessageQueue, SystemClock};
use entrega_testkit::conformance::every_queue_promise;

#[tokio::test]
async fn the_memory_queue_conforms() {
    every_queue_promise(
        || async { Arc::new(MemoryQueue::new(Arc::new(SystemClock))) as Arc<dyn MessageQueue> },
        entrega_testkit::conformance::StaleReceipts::Ignored,
    )
    .await;
}

/// As the embedded queue: receiving is round-robin over groups, and a concurrency key
/// has at most its limit in flight (a visibility change frees its place).
#[tokio::test]
async fn the_memory_queue_serves_groups_in_turn_and_caps_each_key() {
    use std::time::Duration;

    use entrega_core::ports::OutgoingMessage;

    let queue = MemoryQueue::new(Arc::new(SystemClock));
    let message = |body: &str, group: &str, key: Option<&str>| OutgoingMessage {
        body: body.into(),
        group: group.into(),
        delay: Duration::ZERO,
        concurrency_key: key.map(str::to_owned),
        concurrency_limit: 2,
    };
    let backlog = (0..100).map(|i| message(&format!("a{i}"), "a", Some("ep1")));
    queue.send(backlog.collect()).await.unwrap();
    queue.send(vec![message("b0", "b", None)]).await.unwrap();

    let hide = Duration::from_secs(60);
    let first = queue.receive(10, hide).await.unwrap();
    let bodies: Vec<&str> = first.iter().map(|m| m.body.as_str()).collect();
    assert!(
        bodies.contains(&"b0"),
        "group b is not behind a's backlog: {bodies:?}"
    );
    assert_eq!(bodies.len(), 3, "ep1 has two in flight at most: {bodies:?}");
    assert!(queue.receive(10, hide).await.unwrap().is_empty());

    let a = first.iter().find(|m| m.body.starts_with('a')).unwrap();
    queue.change_visibility(&a.receipt, hide).await.unwrap();
    let next = queue.receive(10, hide).await.unwrap();
    assert_eq!(next.len(), 1, "a retry waiting frees its key's place");
    assert!(next[0].body.starts_with('a') && next[0].body != a.body);
    assert_eq!(queue.len(), 101);
}

#[tokio::test]
async fn the_memory_store_conforms() {
    use entrega_core::memory::MemoryStore;
    use entrega_testkit::conformance::every_promise;
    every_promise(&MemoryStore::new(Arc::new(SystemClock))).await;
}
