//! The handlers other than the worker (which has `worker_tests.rs`), each on the
//! in-memory world: fan-out, the failure handler, endpoint health, resend and the
//! 24-hour rule.

use std::time::Duration;

use chrono::{TimeZone, Utc};

use super::age::check_unacknowledged;
use super::failures::handle_failure;
use super::fanout::fan_out;
use super::health;
use super::resend::resend_delivery;
use super::worker::{handle_delivery, Disposition};
use crate::delivery::{Delivery, DeliveryState};
use crate::endpoint::{DeliveryMode, Endpoint};
use crate::event::Event;
use crate::failure::{Acknowledgement, FailureQuery, Reacknowledge};
use crate::ids::{EventId, TenantId};
use crate::memory::{response, World};
use crate::ports::{Audience, Clock, MessageQueue, NoticeKind};
use crate::retry::{RetryPreset, RetrySpec};

const HIDE: Duration = Duration::from_secs(60);

async fn world() -> (World, TenantId) {
    let world = World::new(Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap(), 11);
    let tenant = world
        .add_tenant(TenantId::generate(), "Acme", "owner@acme.example")
        .await
        .unwrap();
    (world, tenant)
}

async fn endpoint(
    world: &World,
    tenant: &TenantId,
    configure: impl FnOnce(&mut Endpoint),
) -> Endpoint {
    world
        .add_endpoint(tenant, "https://hooks.acme.example/", configure)
        .await
        .unwrap()
}

async fn publish(world: &World, tenant: &TenantId, event_type: &str) -> Event {
    let event = Event {
        id: EventId::generate(),
        tenant_id: tenant.clone(),
        event_type: event_type.into(),
        payload: r#"{"invoice":7}"#.into(),
        created_at: world.clock.now(),
    };
    world.services.store.publish(&event).await.unwrap();
    event
}

async fn deliveries(world: &World, event: &Event) -> Vec<Delivery> {
    world
        .services
        .store
        .deliveries_of_event(event)
        .await
        .unwrap()
}

/// Handle every delivery message due now, settling each.
async fn work(world: &World) {
    while let Some(m) = world.deliveries.receive(1, HIDE).await.unwrap().pop() {
        match handle_delivery(&world.services, &m.body, m.receive_count)
            .await
            .unwrap()
        {
            Disposition::Done => world.deliveries.delete(&m.receipt).await.unwrap(),
            Disposition::RetryIn(d) => world
                .deliveries
                .change_visibility(&m.receipt, d)
                .await
                .unwrap(),
        }
    }
}

/// Handle every failure notice, `times` times each (a handler re-run after dying).
async fn handle_failures(world: &World, times: usize) {
    while let Some(m) = world.failures.receive(1, HIDE).await.unwrap().pop() {
        for _ in 0..times {
            handle_failure(&world.services, &m.body).await.unwrap();
        }
        world.failures.delete(&m.receipt).await.unwrap();
    }
}

/// A world whose one event's delivery was tried once, answered 500, exhausted its
/// `none` schedule and was recorded as a failure.
async fn exhausted_delivery() -> (World, Event) {
    let (w, tenant) = world().await;
    endpoint(&w, &tenant, |e| {
        e.retry = RetrySpec::Preset(RetryPreset::None)
    })
    .await;
    w.transport.then([response(500)]);
    let event = publish(&w, &tenant, "invoice.paid").await;
    fan_out(&w.services, &event).await.unwrap();
    work(&w).await;
    handle_failures(&w, 1).await;
    (w, event)
}

#[tokio::test]
async fn a_delivery_created_paused_from_a_lagging_endpoint_list_is_resumed() {
    let (w, tenant) = world().await;
    let disabled = endpoint(&w, &tenant, |e| e.disabled = true).await;
    // The list the fan-out reads still shows the endpoint disabled; the enable (and
    // its resume, which found nothing paused) came before the fan-out's create.
    w.store.lag_endpoint_lists();
    let mut enabled = w
        .services
        .store
        .get_endpoint(&disabled.id)
        .await
        .unwrap()
        .unwrap();
    enabled.disabled = false;
    w.services.store.update_endpoint(&enabled).await.unwrap();
    let event = publish(&w, &tenant, "invoice.paid").await;
    assert_eq!(fan_out(&w.services, &event).await.unwrap(), 1);
    w.store.catch_up_endpoint_lists();
    let created = deliveries(&w, &event).await;
    assert_eq!(created[0].state, DeliveryState::Pending, "resumed at once");
    work(&w).await;
    assert_eq!(w.transport.requests().len(), 1, "and delivered");
    assert_eq!(
        deliveries(&w, &event).await[0].state,
        DeliveryState::Delivered
    );
}

#[tokio::test]
async fn fan_out_makes_a_delivery_per_subscribed_endpoint_once_and_queues_only_what_waits() {
    let (w, tenant) = world().await;
    let all = endpoint(&w, &tenant, |_| {}).await;
    let invoices = endpoint(&w, &tenant, |e| e.event_types = vec!["invoice.paid".into()]).await;
    let off = endpoint(&w, &tenant, |e| e.disabled = true).await;
    let event = publish(&w, &tenant, "lead.created").await;

    assert_eq!(fan_out(&w.services, &event).await.unwrap(), 2);
    let made = deliveries(&w, &event).await;
    let state_of =
        |id: &crate::ids::EndpointId| made.iter().find(|d| &d.endpoint_id == id).map(|d| d.state);
    assert_eq!(state_of(&all.id), Some(DeliveryState::Pending));
    assert_eq!(
        state_of(&off.id),
        Some(DeliveryState::Paused),
        "kept for when it is enabled"
    );
    assert_eq!(state_of(&invoices.id), None, "not subscribed");
    assert_eq!(w.deliveries.len(), 1, "only the waiting delivery is queued");

    // A replayed fan-out (the stream retried, a poller that crashed) makes nothing
    // twice; it queues the untouched delivery again, which the worker tolerates.
    assert_eq!(fan_out(&w.services, &event).await.unwrap(), 2);
    assert_eq!(deliveries(&w, &event).await.len(), 2);
    assert_eq!(w.deliveries.len(), 2);
    work(&w).await;
    assert_eq!(
        w.transport.requests().len(),
        1,
        "the duplicate message sent nothing"
    );
    fan_out(&w.services, &event).await.unwrap();
    assert!(
        w.deliveries.is_empty(),
        "an attempted delivery is not queued again"
    );
}

/// A fan-out run again later (a stream read from its start, a replay) reads today's
/// endpoints: one created after the event gets none of it, one created within the
/// producer's clock skew does.
#[tokio::test]
async fn a_fan_out_run_again_sends_nothing_to_endpoints_created_since() {
    let (w, tenant) = world().await;
    let before = endpoint(&w, &tenant, |_| {}).await;
    let event = publish(&w, &tenant, "invoice.paid").await;
    w.clock.advance(super::fanout::PUBLISH_CLOCK_SKEW);
    let within_skew = endpoint(&w, &tenant, |_| {}).await;
    w.clock.advance(Duration::from_secs(1));
    let later = endpoint(&w, &tenant, |_| {}).await;
    assert_eq!(fan_out(&w.services, &event).await.unwrap(), 2);
    let made: Vec<_> = deliveries(&w, &event)
        .await
        .into_iter()
        .map(|d| d.endpoint_id)
        .collect();
    assert!(
        made.contains(&before.id) && made.contains(&within_skew.id),
        "{made:?}"
    );
    assert!(!made.contains(&later.id), "invented for {}", later.id);
}

#[tokio::test]
async fn a_failure_is_recorded_once_with_its_payload_and_its_side_effects_happen_once() {
    let (mut w, tenant) = world().await;
    w.services.settings.alert_threshold = 1;
    endpoint(&w, &tenant, |e| {
        e.retry = RetrySpec::Preset(RetryPreset::None)
    })
    .await;
    w.transport.otherwise(response(500));
    let mut events = Vec::new();
    for _ in 0..2 {
        let event = publish(&w, &tenant, "invoice.paid").await;
        fan_out(&w.services, &event).await.unwrap();
        events.push(event);
    }
    work(&w).await;
    assert_eq!(
        w.failures.len(),
        2,
        "each exhausted delivery notifies the failure handler"
    );
    // Each notice handled twice: a handler that died after its work runs again.
    handle_failures(&w, 2).await;

    let page = w
        .services
        .store
        .list_failures(&FailureQuery {
            tenant: Some(tenant.clone()),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.data.len(), 2, "one record per failed delivery");
    for failure in &page.data {
        assert_eq!(failure.payload, r#"{"invoice":7}"#);
        assert_eq!(failure.attempt_times.len(), 1);
        assert_eq!(failure.last_status_code, Some(500));
    }
    let notices = w.notices.notices();
    let kinds = |kind: NoticeKind| notices.iter().filter(|n| n.kind == kind).count();
    assert_eq!(
        kinds(NoticeKind::FailureThreshold),
        1,
        "one alert per tenant and hour: {notices:?}"
    );
    assert_eq!(
        kinds(NoticeKind::DeliveryExhausted),
        1,
        "the owner hears once an hour"
    );
    let owner = notices
        .iter()
        .find(|n| n.kind == NoticeKind::DeliveryExhausted)
        .unwrap();
    assert_eq!(
        owner.audience,
        Audience::Owner {
            email: "owner@acme.example".into()
        }
    );
}

/// A delivery that fails for good without using up retries (a 404, which the standard
/// policy does not retry; an at-most-once attempt that failed) will not arrive either:
/// its owner hears, once an hour as for exhausted ones, with the reason.
#[tokio::test]
async fn a_failure_that_is_not_retried_tells_the_owner_too() {
    let (w, tenant) = world().await;
    endpoint(&w, &tenant, |_| {}).await;
    let at_most_once = w.add_tenant(TenantId::generate(), "Once", "owner@once.example");
    let at_most_once = at_most_once.await.unwrap();
    endpoint(&w, &at_most_once, |e| e.mode = DeliveryMode::AtMostOnce).await;
    w.transport.otherwise(response(404));
    for _ in 0..2 {
        for t in [&tenant, &at_most_once] {
            let event = publish(&w, t, "invoice.paid").await;
            fan_out(&w.services, &event).await.unwrap();
        }
    }
    work(&w).await;
    handle_failures(&w, 1).await;
    let notices = w.notices.notices();
    let told: Vec<_> = notices
        .iter()
        .filter(|n| n.kind == NoticeKind::DeliveryFailed)
        .map(|n| (n.audience.clone(), n.details["reason"].clone()))
        .collect();
    let owner = |email: &str| Audience::Owner {
        email: email.into(),
    };
    assert_eq!(
        told,
        [
            (owner("owner@acme.example"), "not_retryable".into()),
            (owner("owner@once.example"), "at_most_once".into())
        ],
        "each owner once, with the reason: {notices:?}"
    );
}

#[tokio::test]
async fn failing_for_the_configured_days_disables_an_endpoint_and_tells_its_owner_once() {
    let (mut w, tenant) = world().await;
    w.services.settings.unhealthy_after = Duration::from_secs(3 * 86_400);
    let ep = endpoint(&w, &tenant, |_| {}).await;
    let current = |w: &World| {
        let (store, id) = (w.services.store.clone(), ep.id.clone());
        async move { store.get_endpoint(&id).await.unwrap().unwrap() }
    };
    for _ in 0..3 {
        health::observe(&w.services, &current(&w).await, false, false, w.clock.now())
            .await
            .unwrap();
        assert!(!current(&w).await.disabled, "not yet");
        w.clock.advance(Duration::from_secs(86_400));
    }
    health::observe(&w.services, &current(&w).await, false, false, w.clock.now())
        .await
        .unwrap();
    assert!(
        !current(&w).await.disabled,
        "three days exactly is not past the limit"
    );
    w.clock.advance(Duration::from_secs(1));
    health::observe(&w.services, &current(&w).await, false, false, w.clock.now())
        .await
        .unwrap();
    assert!(
        current(&w).await.disabled,
        "failing every attempt for over three days"
    );
    health::observe(&w.services, &current(&w).await, false, false, w.clock.now())
        .await
        .unwrap();
    let told = w
        .notices
        .notices()
        .iter()
        .filter(|n| n.kind == NoticeKind::EndpointDisabled)
        .count();
    assert_eq!(told, 1, "the owner is told once");
}

#[tokio::test]
async fn a_resend_delivers_under_a_new_generation_and_acknowledges_the_failure_it_fixes() {
    let (w, event) = exhausted_delivery().await;
    let failed = deliveries(&w, &event).await.remove(0);
    assert_eq!(
        failed.state,
        DeliveryState::Exhausted,
        "one attempt, no retries"
    );

    let resent = resend_delivery(&w.services, &failed, "support@acme")
        .await
        .unwrap();
    assert_eq!(
        (resent.generation, resent.state),
        (1, DeliveryState::Pending)
    );
    work(&w).await;
    let done = deliveries(&w, &event).await.remove(0);
    assert_eq!((done.state, done.generation), (DeliveryState::Delivered, 1));
    let ids: Vec<_> = w
        .transport
        .requests()
        .iter()
        .map(|r| {
            r.headers
                .iter()
                .find(|(n, _)| n == "webhook-id")
                .unwrap()
                .1
                .clone()
        })
        .collect();
    assert_eq!(
        ids,
        [event.id.to_string(), event.id.to_string()],
        "the same webhook-id"
    );
    let failures = w
        .services
        .store
        .failures_of_delivery(&done.id)
        .await
        .unwrap();
    assert_eq!(failures.len(), 1);
    assert!(
        failures[0].acknowledged_at.is_some(),
        "the resend's success closes it"
    );
    assert_eq!(failures[0].acknowledged_by.as_deref(), Some("support@acme"));
}

#[tokio::test]
async fn an_unacknowledged_failure_alerts_once_a_day_after_24_hours_until_acknowledged() {
    let (w, event) = exhausted_delivery().await;
    let on_call = |w: &World| {
        w.notices
            .notices()
            .iter()
            .filter(|n| n.kind == NoticeKind::FailureUnacknowledged)
            .count()
    };

    w.clock.advance(Duration::from_secs(23 * 3600));
    check_unacknowledged(&w.services).await.unwrap();
    assert_eq!(on_call(&w), 0, "within its day");
    w.clock.advance(Duration::from_secs(2 * 3600));
    let age = check_unacknowledged(&w.services).await.unwrap().unwrap();
    assert_eq!(age, Duration::from_secs(25 * 3600));
    check_unacknowledged(&w.services).await.unwrap();
    assert_eq!(
        on_call(&w),
        1,
        "once per failure per day, however often checked"
    );

    let failure = w
        .services
        .store
        .failures_of_delivery(&deliveries(&w, &event).await[0].id)
        .await
        .unwrap()
        .remove(0);
    let ack = Acknowledgement {
        note: "customer told".into(),
        by: "support".into(),
        at: w.clock.now(),
    };
    w.services
        .store
        .acknowledge_failure(&failure.id, &ack, Reacknowledge::Replace)
        .await
        .unwrap();
    assert_eq!(check_unacknowledged(&w.services).await.unwrap(), None);
}

#[tokio::test]
async fn the_end_of_a_real_outage_is_published_once_and_a_flap_publishes_nothing() {
    let (w, tenant) = world().await;
    let ep = endpoint(&w, &tenant, |_| {}).await;
    let current = |w: &World| {
        let (store, id) = (w.services.store.clone(), ep.id.clone());
        async move { store.get_endpoint(&id).await.unwrap().unwrap() }
    };
    let observe = |w: &World, ok: bool| {
        let (services, now) = (w.services.clone(), w.clock.now());
        let current = current(w);
        async move {
            health::observe(&services, &current.await, ok, false, now)
                .await
                .unwrap()
        }
    };
    let recovered = |w: &World| {
        let outbox = w.store.clone();
        async move {
            use crate::ports::EventStore;
            let page = outbox
                .outbox_page(Utc.timestamp_opt(0, 0).unwrap(), None, 100)
                .await
                .unwrap();
            page.events
                .iter()
                .filter(|e| e.event_type == "entrega.endpoint.recovered")
                .count()
        }
    };
    // A flap: failing for less than a minute, then fine.
    observe(&w, false).await;
    w.clock.advance(Duration::from_secs(30));
    observe(&w, true).await;
    w.clock.advance(Duration::from_secs(120));
    observe(&w, true).await;
    assert_eq!(recovered(&w).await, 0, "a flap announces nothing");

    // An outage: failing for two minutes, then succeeding for over a minute.
    observe(&w, false).await;
    w.clock.advance(Duration::from_secs(120));
    observe(&w, false).await;
    observe(&w, true).await;
    w.clock.advance(Duration::from_secs(61));
    observe(&w, true).await;
    w.clock.advance(Duration::from_secs(60));
    observe(&w, true).await;
    assert_eq!(recovered(&w).await, 1, "the recovery is published once");
}
