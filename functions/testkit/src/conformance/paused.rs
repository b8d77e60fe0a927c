//! An endpoint's paused deliveries, paged: what a background resume reads.

use chrono::Utc;
use entrega_core::delivery::{Delivery, DeliveryState};
use entrega_core::endpoint::Endpoint;
use entrega_core::event::Event;
use entrega_core::ids::{DeliveryId, EventId};
use entrega_core::ports::Store;

use super::tenant;

/// Paused deliveries of one endpoint come a page at a time, each once, while each
/// page's move on (as a resume moves them), the others (waiting ones, another
/// endpoint's) never; the cursor ends when they do.
pub async fn paused_deliveries_page_through_once(store: &dyn Store) {
    let t = tenant(store).await;
    let now = Utc::now();
    let endpoint = Endpoint::new(t.clone(), "https://hooks.example.com/paused", now);
    let other = Endpoint::new(t.clone(), "https://hooks.example.com/other", now);
    let mut paused = Vec::new();
    for i in 0..12 {
        let event = Event {
            id: EventId::generate(),
            tenant_id: t.clone(),
            event_type: "a.b".into(),
            payload: "{}".into(),
            created_at: now,
        };
        let to = if i % 4 == 3 { &other } else { &endpoint };
        let id = DeliveryId::for_event(&event.id, &to.id, now.timestamp_millis());
        let mut d = Delivery::new(id, &event, to.id.clone(), false, now);
        // Every third of this endpoint's still waits; the rest are paused.
        if i % 3 != 0 {
            d.state = DeliveryState::Paused;
            if to.id == endpoint.id {
                paused.push(d.id.clone());
            }
        }
        store.create_delivery_if_absent(&d).await.unwrap();
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..20 {
        let page = store
            .paused_deliveries(&endpoint.id, cursor.as_deref(), 2)
            .await
            .unwrap();
        assert!(page.data.len() <= 2, "at most the limit");
        for d in &page.data {
            assert_eq!(d.endpoint_id, endpoint.id);
            assert_eq!(d.state, DeliveryState::Paused);
        }
        // As a resume does: each page's deliveries move on before the next page.
        for d in &page.data {
            let mut resumed = d.clone();
            resumed.state = DeliveryState::Pending;
            store.save_delivery(&resumed, &[]).await.unwrap();
        }
        seen.extend(page.data.into_iter().map(|d| d.id));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    seen.sort();
    paused.sort();
    assert_eq!(seen, paused, "every paused delivery of the endpoint, once");
    let again = store
        .paused_deliveries(&endpoint.id, None, 2)
        .await
        .unwrap();
    assert!(
        again.data.is_empty() && again.next_cursor.is_none(),
        "none left"
    );
}
