//! `serve --backend aws` stopped and started again: the outbox stream is read on from
//! where the last run left it, as Lambda's event source mapping keeps its place.

use std::sync::Arc;
use std::time::Duration;

use entrega_core::ports::SystemClock;
use entrega_core::retry::RetrySpec;
use entrega_testkit::{eventually, Receiver};
use tokio::sync::watch;

use crate::harness::Stack;
use crate::support::*;

/// Read again from its start, the stream handed every old event to the fan-out, which
/// made deliveries for the endpoints of the day: an endpoint created since got events
/// published before it existed (a hostile test).
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_reads_the_outbox_stream_on_from_where_it_stopped() {
    let stack = Stack::provisioned(Arc::new(SystemClock)).await;
    let s = &stack.services.clone();
    let tenant = tenant(s).await;
    let first = Receiver::answering(200).await;
    endpoint(s, &tenant, first.url("/"), RetrySpec::default()).await;
    let old = event(s, &tenant, "a.b", "{}");
    s.store.publish(&old).await.unwrap();
    let run = || {
        let (stop, stopped) = watch::channel(false);
        (stop, tokio::spawn(stack.emulation().run(stopped)))
    };

    let (stop, running) = run();
    eventually(Duration::from_secs(60), "the old event", || async {
        (first.count() == 1).then_some(())
    })
    .await;
    stop.send(true).unwrap();
    running.await.unwrap();

    // Created within the producer's clock skew of the old event, so only the stream's
    // kept place keeps it from being handed the old event again.
    let second = Receiver::answering(200).await;
    endpoint(s, &tenant, second.url("/"), RetrySpec::default()).await;
    let new = event(s, &tenant, "a.b", "{}");
    s.store.publish(&new).await.unwrap();
    let (stop, running) = run();
    eventually(Duration::from_secs(60), "the new event at both", || async {
        (first.count() == 2 && second.count() == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        second.distinct_webhook_ids(),
        vec![new.id.to_string()],
        "the old event was never the new endpoint's"
    );
    assert_eq!(first.count(), 2, "nothing sent twice");
    stop.send(true).unwrap();
    running.await.unwrap();
}
