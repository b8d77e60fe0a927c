//! Scenarios of the deterministic simulation (`entrega_testkit::sim`): the real
//! handlers in virtual time, each run checked against the invariants.

use chrono::DateTime;
use entrega_core::delivery::DeliveryState;
use entrega_core::memory::response;
use entrega_testkit::sim::scenarios::thundering_herd;
use entrega_testkit::sim::{seed_or, Sim};

mod neighbours;
mod soak;

const HOUR: chrono::Duration = chrono::Duration::hours(1);

/// One endpoint is down for six hours while 1 200 events are produced (one every
/// 18 s): all of them are delivered after it returns, within `standard`'s 31-hour
/// window, none lost, and every attempt is on record.
#[tokio::test]
async fn six_hour_outage_loses_nothing() {
    let mut sim = Sim::new(seed_or(1));
    let tenant = sim.tenant("Acme").await;
    let start = sim.now();
    let back: DateTime<_> = start + HOUR * 6;
    let url = "https://down-for-six-hours.example/hook";
    sim.endpoint(
        &tenant,
        url,
        |_| {},
        Box::new(move |now, _| response(if now < back { 503 } else { 200 })),
    )
    .await;

    const EVENTS: i64 = 1_200;
    for i in 0..EVENTS {
        sim.publish(&tenant, "lead.created").await;
        sim.run_until(start + chrono::Duration::seconds(18 * (i + 1)))
            .await;
    }
    sim.run_until(start + HOUR * 40).await;

    sim.check_invariants().await;
    let deliveries = sim.deliveries().await;
    assert_eq!(deliveries.len(), EVENTS as usize);
    let mut latest = chrono::Duration::zero();
    for d in &deliveries {
        assert_eq!(
            d.state,
            DeliveryState::Delivered,
            "seed {}: {}",
            sim.seed,
            d.id
        );
        let took = d.delivered_at.unwrap() - d.created_at;
        assert!(took <= HOUR * 31, "seed {}: {} took {took}", sim.seed, d.id);
        assert!(
            d.delivered_at.unwrap() >= back,
            "nothing arrives while it is down"
        );
        latest = latest.max(took);
    }
    let arrivals = sim.arrivals();
    let failed = arrivals.iter().filter(|a| a.at < back).count();
    println!(
        "six-hour outage, seed {}: {} requests ({failed} while down), slowest delivery {} min",
        sim.seed,
        arrivals.len(),
        latest.num_minutes()
    );
}

/// The same seed gives the same run, request for request; another seed another run.
#[tokio::test]
async fn a_seed_replays_its_run() {
    async fn run(seed: u64) -> Vec<(String, String, i64)> {
        let mut sim = Sim::new(seed);
        let tenant = sim.tenant("Acme").await;
        let start = sim.now();
        let flaky = start + HOUR;
        sim.endpoint(
            &tenant,
            "https://flaky.example/",
            |_| {},
            Box::new(move |now, _| response(if now < flaky { 500 } else { 204 })),
        )
        .await;
        for _ in 0..50 {
            sim.publish(&tenant, "a.b").await;
        }
        sim.run_until(start + HOUR * 10).await;
        sim.check_invariants().await;
        sim.arrivals()
            .into_iter()
            .map(|a| (a.url, a.webhook_id, a.at.timestamp_micros()))
            .collect()
    }
    let first = run(42).await;
    assert!(first.len() > 50, "retries happened");
    assert_eq!(first, run(42).await);
    assert_ne!(first, run(43).await);
}

/// The receiver processes a webhook, then answers after the timeout: it is sent again
/// with the same `webhook-id`, so a receiver that deduplicates by it creates exactly
/// one lead per event.
#[tokio::test]
async fn processed_but_timed_out_is_redelivered_with_the_same_id() {
    use entrega_core::outcome::{FailureKind, TransportResult};
    use std::sync::{Arc, Mutex};

    let mut sim = Sim::new(seed_or(3));
    let tenant = sim.tenant("Acme").await;
    // Every first request of an event is processed, then its answer comes too late.
    let calls = Arc::new(Mutex::new(std::collections::HashMap::<String, usize>::new()));
    sim.endpoint(
        &tenant,
        "https://slow-to-answer.example/",
        |_| {},
        Box::new(move |_, webhook_id| {
            let mut calls = calls.lock().unwrap();
            let n = calls.entry(webhook_id.to_owned()).or_default();
            *n += 1;
            if *n == 1 {
                TransportResult::Failed {
                    kind: FailureKind::Timeout,
                    message: "no answer within 10 s".into(),
                }
            } else {
                response(200)
            }
        }),
    )
    .await;
    let mut published = Vec::new();
    for _ in 0..20 {
        published.push(sim.publish(&tenant, "lead.created").await.id.to_string());
        // One event at a time, each settled before the next.
        let until = sim.now() + HOUR;
        sim.run_until(until).await;
    }
    sim.check_invariants().await;

    let arrivals = sim.arrivals();
    assert_eq!(
        arrivals.len(),
        40,
        "each event twice: the timed-out try and the retry"
    );
    let leads: std::collections::HashSet<&str> =
        arrivals.iter().map(|a| a.webhook_id.as_str()).collect();
    assert_eq!(
        leads.len(),
        20,
        "a receiver deduplicating by webhook-id makes one lead each"
    );
    for id in &published {
        let copies = arrivals.iter().filter(|a| &a.webhook_id == id).count();
        assert_eq!(copies, 2, "{id}: both copies carry the event's id");
    }
    for d in sim.deliveries().await {
        assert_eq!(d.state, DeliveryState::Delivered);
        assert_eq!(d.attempt_count, 2);
    }
}

/// "What did this customer receive last week?" after a week of mixed traffic to three
/// endpoints: the delivery log, filtered by endpoint and paged, holds exactly what
/// the endpoint accepted, newest first, across pages.
#[tokio::test]
async fn a_week_of_traffic_reads_back_from_the_delivery_log_page_by_page() {
    use entrega_core::delivery::DeliveryStatus;
    use entrega_core::ports::DeliveryQuery;

    let mut sim = Sim::new(seed_or(4));
    let tenant = sim.tenant("Acme").await;
    let start = sim.now();
    // One endpoint always fine, one down on day 3, one rejecting every other hour.
    let steady = sim
        .endpoint(
            &tenant,
            "https://steady.example/",
            |_| {},
            Box::new(|_, _| response(204)),
        )
        .await;
    let outage = start + HOUR * 48;
    sim.endpoint(
        &tenant,
        "https://down-on-day-three.example/",
        |_| {},
        Box::new(move |now, _| {
            response(if now >= outage && now < outage + HOUR * 24 {
                503
            } else {
                200
            })
        }),
    )
    .await;
    sim.endpoint(
        &tenant,
        "https://picky.example/",
        |e| e.event_types = vec!["invoice.paid".into()],
        Box::new(move |now, _| {
            response(if (now - start).num_hours() % 2 == 0 {
                200
            } else {
                400
            })
        }),
    )
    .await;
    for hour in 0..(7 * 24) {
        for (i, kind) in ["lead.created", "invoice.paid", "lead.created"]
            .iter()
            .enumerate()
        {
            sim.publish(&tenant, kind).await;
            sim.run_until(start + HOUR * hour + chrono::Duration::minutes(20 * (i as i64 + 1)))
                .await;
        }
    }
    sim.run_until(start + HOUR * (7 * 24 + 31)).await;
    sim.check_invariants().await;

    // What the steady endpoint accepted, by event id.
    let mut accepted: Vec<String> = sim
        .arrivals()
        .into_iter()
        .filter(|a| a.url == steady.url && a.answer.failure_kind().is_none())
        .map(|a| a.webhook_id)
        .collect();
    // The log pages newest first: read it all back, a page of 50 at a time.
    let mut logged = Vec::new();
    let mut cursor = None;
    let mut pages = 0;
    loop {
        let page = sim
            .world
            .services
            .store
            .list_deliveries(&DeliveryQuery {
                tenant: Some(tenant.clone()),
                endpoint_id: Some(steady.id.clone()),
                status: Some(DeliveryStatus::Delivered),
                since: Some(start),
                until: Some(start + HOUR * (7 * 24)),
                limit: 50,
                cursor,
                ..Default::default()
            })
            .await
            .unwrap();
        pages += 1;
        logged.extend(page.data.into_iter().map(|d| d.event_id.to_string()));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    accepted.reverse();
    assert!(pages > 5, "the answer spans pages ({pages})");
    assert_eq!(
        logged, accepted,
        "the log is what the endpoint received, newest first"
    );
}

/// Thundering herd: 1 000 events fail together when their endpoint goes down; when it
/// returns, the retries reach it spread out by the schedule's jitter rather than all
/// at once. Peak ÷ mean is taken over the 10-second bins in which retries arrived;
/// the bound is justified in the assertion's comment.
#[tokio::test]
async fn a_recovering_endpoint_is_not_hit_by_every_retry_at_once() {
    let herd = thundering_herd(seed_or(5)).await;
    println!("{herd}");
    assert_eq!(
        herd.after_recovery, 1_000,
        "each event once after the recovery"
    );
    // Each retry lands uniformly within ±20 % of its delay, and the jitters of the
    // earlier steps add up, so arrival density after the recovery is a smooth hump
    // spanning minutes; its peak is at most about twice its mean, and counting noise
    // in 10-second bins (a few dozen arrivals each) adds well under that again.
    assert!(herd.peak / herd.mean <= 3.0, "{herd}");
    assert!(
        herd.span_s >= 120,
        "spread over minutes, not seconds: {herd}"
    );
}
