//! Message queues: what every adapter of the port promises (in memory, SQLite, SQS).
//! Each promise gets a fresh, empty queue from the caller's factory, and needs no
//! time to pass: a message is brought back with a visibility change of zero.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use entrega_core::ports::{MessageQueue, OutgoingMessage, ReceivedMessage};

/// Long enough that nothing reappears by itself while a promise is checked.
const HIDDEN: Duration = Duration::from_secs(300);
/// Receives tried before concluding that a queue hands out nothing more (SQS answers
/// a receive with a sample of its hosts, so one empty answer proves little).
const DRAIN_TRIES: usize = 3;

fn message(body: &str, group: &str) -> OutgoingMessage {
    OutgoingMessage {
        body: body.into(),
        group: group.into(),
        delay: Duration::ZERO,
        concurrency_key: None,
        concurrency_limit: 0,
    }
}

/// What an adapter does with a receipt from before the message's latest receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaleReceipts {
    /// Ignored: a worker that lost its message to a later receive can neither delete
    /// nor hide it under the one now holding it (memory, SQLite).
    Ignored,
    /// Accepted without an error, and it may still act: SQS documents that a delete
    /// with an old receipt "succeeds, but the message might not be deleted". The
    /// handlers need no more than this, because every write they make is conditional
    /// on the version it read; what they do need is that a late settle never fails.
    AcceptedWithoutError,
}

/// Every queue promise, each on a fresh queue from `fresh`.
pub async fn every_queue_promise<F, Fut>(fresh: F, stale: StaleReceipts)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn MessageQueue>>,
{
    a_received_message_is_hidden_until_it_comes_back_or_is_deleted(fresh().await.as_ref()).await;
    every_message_is_handed_out_once_while_hidden(fresh().await.as_ref()).await;
    a_delayed_message_waits(fresh().await.as_ref()).await;
    a_stale_receipt_is_never_an_error(fresh().await.as_ref(), stale).await;
}

/// Receive until `want` messages came or the queue keeps answering empty.
async fn drain(queue: &dyn MessageQueue, want: usize) -> Vec<ReceivedMessage> {
    let mut got = Vec::new();
    let mut empty = 0;
    while got.len() < want && empty < DRAIN_TRIES {
        let batch = queue.receive(want - got.len(), HIDDEN).await.unwrap();
        assert!(
            batch.len() <= want - got.len(),
            "a receive handed out more than asked"
        );
        if batch.is_empty() {
            empty += 1;
        }
        got.extend(batch);
    }
    got
}

/// One message sent, received (and hidden), made visible and received again: its two
/// receipts, the first now stale.
async fn received_twice(queue: &dyn MessageQueue) -> (ReceivedMessage, ReceivedMessage) {
    queue.send(vec![message("m1", "t1")]).await.unwrap();
    let mut first = drain(queue, 1).await;
    assert_eq!(first.len(), 1, "the sent message is received");
    assert_eq!((first[0].body.as_str(), first[0].receive_count), ("m1", 1));
    assert!(
        queue.receive(10, HIDDEN).await.unwrap().is_empty(),
        "a received message is hidden"
    );

    queue
        .change_visibility(&first[0].receipt, Duration::ZERO)
        .await
        .unwrap();
    let mut second = drain(queue, 1).await;
    assert_eq!(second.len(), 1, "made visible, it comes back");
    assert_eq!(second[0].body, "m1");
    assert_eq!(second[0].receive_count, 2, "every receive counts");
    (first.remove(0), second.remove(0))
}

pub async fn a_received_message_is_hidden_until_it_comes_back_or_is_deleted(
    queue: &dyn MessageQueue,
) {
    let (_, second) = received_twice(queue).await;
    queue.delete(&second.receipt).await.unwrap();
    queue
        .change_visibility(&second.receipt, Duration::ZERO)
        .await
        .ok();
    assert!(
        drain(queue, 1).await.is_empty(),
        "a deleted message never comes back"
    );
}

pub async fn every_message_is_handed_out_once_while_hidden(queue: &dyn MessageQueue) {
    let bodies: Vec<String> = (0..7).map(|i| format!("b{i}")).collect();
    let messages = bodies
        .iter()
        .enumerate()
        .map(|(i, b)| message(b, if i % 2 == 0 { "even" } else { "odd" }))
        .collect();
    queue.send(messages).await.unwrap();
    let got = drain(queue, bodies.len()).await;
    let seen: HashSet<&str> = got.iter().map(|m| m.body.as_str()).collect();
    assert_eq!(got.len(), bodies.len(), "each message once: {seen:?}");
    assert_eq!(seen, bodies.iter().map(String::as_str).collect());
    assert!(got.iter().all(|m| m.receive_count == 1));
    for m in &got {
        queue.delete(&m.receipt).await.unwrap();
    }
    assert!(drain(queue, 1).await.is_empty());
}

pub async fn a_delayed_message_waits(queue: &dyn MessageQueue) {
    let mut later = message("later", "t1");
    later.delay = HIDDEN;
    queue.send(vec![later, message("now", "t1")]).await.unwrap();
    let got = drain(queue, 2).await;
    let bodies: Vec<&str> = got.iter().map(|m| m.body.as_str()).collect();
    assert_eq!(bodies, ["now"], "only the undelayed message is received");
}

/// A message received twice: the first receipt is stale. Settling with it is never an
/// error; where the adapter promises [`StaleReceipts::Ignored`], it also leaves the
/// message with its current holder, whose receipt still works.
pub async fn a_stale_receipt_is_never_an_error(queue: &dyn MessageQueue, stale: StaleReceipts) {
    let (first, second) = received_twice(queue).await;
    let old = &first.receipt;
    queue
        .change_visibility(old, Duration::ZERO)
        .await
        .expect("hiding with a stale receipt is not an error");
    queue
        .delete(old)
        .await
        .expect("deleting with a stale receipt is not an error");

    if stale == StaleReceipts::Ignored {
        assert!(
            queue.receive(10, HIDDEN).await.unwrap().is_empty(),
            "a stale receipt did not make the message visible under its holder"
        );
        queue
            .change_visibility(&second.receipt, Duration::ZERO)
            .await
            .unwrap();
        let third = drain(queue, 1).await;
        assert_eq!(third.len(), 1, "a stale receipt deleted nothing");
        assert_eq!(third[0].receive_count, 3);
        queue.delete(&third[0].receipt).await.unwrap();
    } else {
        queue
            .delete(&second.receipt)
            .await
            .expect("the current receipt settles, whatever the stale one did");
        for late in drain(queue, 1).await {
            queue.delete(&late.receipt).await.unwrap();
        }
    }
    assert!(drain(queue, 1).await.is_empty(), "settled for good");
}
