//! Set-up shared by the crate's unit tests.

use chrono::Utc;
use entrega_core::endpoint::Endpoint;
use entrega_core::event::Event;
use entrega_core::ids::{EventId, TenantId};
use entrega_core::ports::Services;
use entrega_core::tenant::Tenant;

/// A new tenant with one endpoint at `url`, stored; and a maker of its events (not
/// stored).
pub async fn tenant_with_endpoint(
    services: &Services,
    url: &str,
) -> (Endpoint, impl Fn() -> Event) {
    let tenant = Tenant {
        id: TenantId::generate(),
        name: "T".into(),
        owner_email: "owner@example.com".into(),
        created_at: Utc::now(),
    };
    services.store.create_tenant(&tenant, "hash").await.unwrap();
    let endpoint = Endpoint::new(tenant.id.clone(), url, Utc::now());
    services.store.create_endpoint(&endpoint).await.unwrap();
    let event = move || Event {
        id: EventId::generate(),
        tenant_id: tenant.id.clone(),
        event_type: "a.b".into(),
        payload: "{}".into(),
        created_at: Utc::now(),
    };
    (endpoint, event)
}
