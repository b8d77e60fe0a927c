//! Handlers under virtual time — the 24-hour rule, endpoint health, the failure
//! handler's side effects — on a real SQLite store, a manual clock, and a notifier
//! that records what would leave the process.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use entrega_core::failure::{Failure, FailureReason};
use entrega_core::handlers::age::check_unacknowledged;
use entrega_core::ids::{DeliveryId, EndpointId, EventId, FailureId, TenantId};
use entrega_core::ports::{Audience, Clock, ManualClock, Notice, Notifier, StoreResult};
use entrega_embedded::metrics::PrometheusMetrics;
use entrega_embedded::serve::open_sqlite;
use entrega_http::transport::{HttpTransport, TargetPolicy};

use crate::harness::TempDir;

#[derive(Default)]
struct Recorded(Mutex<Vec<Notice>>);

#[async_trait]
impl Notifier for Recorded {
    async fn notify(&self, notice: &Notice) -> StoreResult<()> {
        self.0.lock().unwrap().push(notice.clone());
        Ok(())
    }
}

fn failure(now: chrono::DateTime<Utc>) -> Failure {
    let event = EventId::generate();
    let endpoint = EndpointId::generate();
    let delivery = DeliveryId::for_event(&event, &endpoint, now.timestamp_millis());
    Failure {
        id: FailureId::for_delivery(&delivery, 0, now.timestamp_millis()),
        tenant_id: TenantId::generate(),
        delivery_id: delivery,
        event_id: event,
        event_type: "a.b".into(),
        endpoint_id: endpoint,
        reason: FailureReason::Exhausted,
        payload: "{}".into(),
        attempt_times: vec![now],
        last_status_code: Some(500),
        last_error: Some("server_error: HTTP 500".into()),
        created_at: now,
        acknowledged_at: None,
        ack_note: None,
        acknowledged_by: None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unacknowledged_failure_alerts_after_24_hours_and_ack_clears_the_metric() {
    let dir = TempDir::new("age");
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let transport = Arc::new(HttpTransport::new(TargetPolicy::default()));
    let (mut services, _) = open_sqlite(&dir.0.join("age.db"), clock.clone(), transport)
        .await
        .unwrap();
    let notices = Arc::new(Recorded::default());
    let metrics = Arc::new(PrometheusMetrics::default());
    services.notifier = notices.clone();
    services.metrics = metrics.clone();

    let old = failure(clock.now());
    services.store.put_failure_if_absent(&old).await.unwrap();
    clock.advance(Duration::from_secs(3600));
    let young = failure(clock.now());
    services.store.put_failure_if_absent(&young).await.unwrap();

    let age = check_unacknowledged(&services).await.unwrap().unwrap();
    assert_eq!(age.as_secs(), 3600, "the oldest is an hour old");
    assert!(
        notices.0.lock().unwrap().is_empty(),
        "nothing is overdue yet"
    );

    clock.advance(Duration::from_secs(23 * 3600 + 60));
    let age = check_unacknowledged(&services).await.unwrap().unwrap();
    assert!(age > Duration::from_secs(24 * 3600));
    {
        let sent = notices.0.lock().unwrap();
        assert_eq!(sent.len(), 1, "only the failure past 24 h: {sent:?}");
        assert_eq!(sent[0].kind.as_str(), "failure_unacknowledged");
        assert_eq!(sent[0].audience, Audience::OnCall);
        assert_eq!(sent[0].details["failure_id"], old.id.as_str());
    }
    check_unacknowledged(&services).await.unwrap();
    assert_eq!(
        notices.0.lock().unwrap().len(),
        1,
        "one alert per failure per day, even with no new failure"
    );
    assert!(metrics.render(&[]).contains(&format!(
        "entrega_oldest_unacknowledged_failure_age_seconds {}",
        age.as_secs()
    )));

    // Acknowledging both clears them from the age metric.
    for f in [&old, &young] {
        services
            .store
            .acknowledge_failure(
                &f.id,
                &entrega_core::failure::Acknowledgement {
                    note: "handled".into(),
                    by: "admin".into(),
                    at: clock.now(),
                },
                entrega_core::failure::Reacknowledge::Replace,
            )
            .await
            .unwrap();
    }
    assert_eq!(check_unacknowledged(&services).await.unwrap(), None);
    assert!(metrics
        .render(&[])
        .contains("entrega_oldest_unacknowledged_failure_age_seconds 0"));
}

/// Endpoint health under virtual time: failing every attempt for the configured period
/// disables the endpoint and tells its owner; a success after a failing stretch
/// publishes `entrega.endpoint.recovered`.
#[tokio::test(flavor = "multi_thread")]
async fn an_endpoint_failing_for_five_days_is_disabled_and_recovery_is_announced() {
    use entrega_core::endpoint::Endpoint;
    use entrega_core::handlers::health::observe;
    use entrega_core::tenant::Tenant;

    let dir = TempDir::new("health");
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let transport = Arc::new(HttpTransport::new(TargetPolicy::default()));
    let (mut services, _) = open_sqlite(&dir.0.join("health.db"), clock.clone(), transport)
        .await
        .unwrap();
    let notices = Arc::new(Recorded::default());
    services.notifier = notices.clone();
    let tenant = Tenant {
        id: TenantId::generate(),
        name: "Acme".into(),
        owner_email: "owner@acme.example".into(),
        created_at: clock.now(),
    };
    services.store.create_tenant(&tenant, "hash").await.unwrap();
    let now = clock.now();
    let endpoint = Endpoint::new(tenant.id.clone(), "https://hooks.example.com/", now);

    services
        .store
        .create_endpoint(&endpoint, entrega_core::endpoint::MAX_ENDPOINTS_PER_TENANT)
        .await
        .unwrap();
    let current = |s: &entrega_core::ports::Services| {
        let (s, id) = (s.clone(), endpoint.id.clone());
        async move { s.store.get_endpoint(&id).await.unwrap().unwrap() }
    };
    // An attempt at the endpoint as stored now, quick, that `succeeded` or not.
    let attempt = |succeeded: bool| {
        let (s, now) = (services.clone(), clock.now());
        async move {
            let read = current(&s).await;
            observe(&s, &read, succeeded, false, now).await.unwrap();
        }
    };

    // A failing stretch of four days: still enabled.
    attempt(false).await;
    let started = current(&services)
        .await
        .health
        .failing_since
        .expect("the stretch starts");
    clock.advance(Duration::from_secs(4 * 86_400));
    attempt(false).await;
    assert!(!current(&services).await.disabled);
    assert_eq!(
        current(&services).await.health.failing_since,
        Some(started),
        "the stretch keeps its start"
    );

    // A success ends the stretch; once successes have held a minute, the recovery is
    // announced to opted-in endpoints (not at the first success: hysteresis).
    attempt(true).await;
    assert_eq!(current(&services).await.health.failing_since, None);
    clock.advance(Duration::from_secs(61));
    attempt(true).await;
    let recovered: EventId = format!(
        "entrega-recovered-{}-{}",
        endpoint.id,
        clock.now().timestamp()
    )
    .parse()
    .unwrap();
    let event = services
        .store
        .get_event(&tenant.id, &recovered)
        .await
        .unwrap()
        .expect("entrega.endpoint.recovered published");
    assert_eq!(event.event_type, "entrega.endpoint.recovered");

    // A new stretch past five days disables it, once, and tells the owner.
    attempt(false).await;
    clock.advance(Duration::from_secs(5 * 86_400 + 1));
    attempt(false).await;
    let after = current(&services).await;
    assert!(after.disabled);
    assert_eq!(
        after.disabled_reason.as_deref(),
        Some("every attempt failed for 5 days")
    );
    observe(&services, &after, false, false, clock.now())
        .await
        .unwrap();
    let sent = notices.0.lock().unwrap();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].kind.as_str(), "endpoint_disabled");
    assert_eq!(
        sent[0].audience,
        Audience::Owner {
            email: "owner@acme.example".into()
        }
    );
}

/// The failure handler died after writing the record (the notice comes back): run
/// again, it still counts, alerts and tells the owner, once; run a third time, nothing
/// more leaves the process.
#[tokio::test(flavor = "multi_thread")]
async fn a_failure_handler_that_died_after_its_record_still_alerts_exactly_once() {
    use entrega_core::delivery::{Delivery, DeliveryState};
    use entrega_core::endpoint::Endpoint;
    use entrega_core::event::Event;
    use entrega_core::failure::FailureNotice;
    use entrega_core::handlers::failures::handle_failure;
    use entrega_core::tenant::Tenant;

    let dir = TempDir::new("effects");
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let transport = Arc::new(HttpTransport::new(TargetPolicy::default()));
    let (mut services, _) = open_sqlite(&dir.0.join("fx.db"), clock.clone(), transport)
        .await
        .unwrap();
    let notices = Arc::new(Recorded::default());
    services.notifier = notices.clone();
    services.settings.alert_threshold = 0;
    let now = clock.now();
    let tenant = Tenant {
        id: TenantId::generate(),
        name: "Acme".into(),
        owner_email: "owner@acme.example".into(),
        created_at: now,
    };
    services.store.create_tenant(&tenant, "h").await.unwrap();
    let endpoint = Endpoint::new(tenant.id.clone(), "https://hooks.example.com/", now);
    services
        .store
        .create_endpoint(&endpoint, entrega_core::endpoint::MAX_ENDPOINTS_PER_TENANT)
        .await
        .unwrap();
    let event = Event {
        id: EventId::generate(),
        tenant_id: tenant.id.clone(),
        event_type: "lead.won".into(),
        payload: "{}".into(),
        created_at: now,
    };
    services.store.publish(&event).await.unwrap();
    let id = DeliveryId::for_event(&event.id, &endpoint.id, now.timestamp_millis());
    let delivery = Delivery {
        state: DeliveryState::Exhausted,
        ..Delivery::new(id.clone(), &event, endpoint.id.clone(), false, now)
    };
    services
        .store
        .create_delivery_if_absent(&delivery)
        .await
        .unwrap();
    let notice = FailureNotice {
        delivery_id: id.clone(),
        tenant_id: tenant.id.clone(),
        generation: 0,
        reason: FailureReason::Exhausted,
        failed_at: now,
    };
    // The first run wrote its record, then died.
    let record = Failure {
        id: FailureId::for_delivery(&id, 0, now.timestamp_millis()),
        tenant_id: tenant.id.clone(),
        delivery_id: id.clone(),
        event_id: event.id.clone(),
        endpoint_id: endpoint.id.clone(),
        event_type: "lead.won".into(),
        ..failure(now)
    };
    assert!(services.store.put_failure_if_absent(&record).await.unwrap());

    let body = serde_json::to_string(&notice).unwrap();
    handle_failure(&services, &body).await.unwrap();
    let kinds = |n: &Recorded| -> Vec<String> {
        let mut k: Vec<String> =
            n.0.lock()
                .unwrap()
                .iter()
                .map(|n| n.kind.to_string())
                .collect();
        k.sort();
        k
    };
    assert_eq!(
        kinds(&notices),
        ["delivery_exhausted", "failure_threshold"],
        "the run after the crash alerts and tells the owner"
    );
    let operational: EventId = format!("entrega-exhausted-{id}-0").parse().unwrap();
    assert!(services
        .store
        .get_event(&tenant.id, &operational)
        .await
        .unwrap()
        .is_some());

    handle_failure(&services, &body).await.unwrap();
    assert_eq!(
        kinds(&notices).len(),
        2,
        "and a further run sends nothing twice"
    );
    let counted = services
        .store
        .increment_once(
            &format!(
                "failures#{}#{}",
                tenant.id,
                chrono::DurationRound::duration_trunc(now, chrono::TimeDelta::hours(1))
                    .unwrap()
                    .timestamp()
            ),
            &format!("counted#{}", record.id),
            Duration::from_secs(3600),
        )
        .await
        .unwrap();
    assert_eq!(counted, 1, "counted once");
}
