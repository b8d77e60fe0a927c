//! Set-up shared by the crate's unit tests.

use std::sync::Arc;

use chrono::Utc;
use entrega_core::endpoint::Endpoint;
use entrega_core::event::Event;
use entrega_core::ids::{EventId, TenantId};
use entrega_core::ports::{Clock, Services};
use entrega_core::tenant::Tenant;
use entrega_http::transport::{HttpTransport, TargetPolicy};

use crate::sqlite::backlog::EmbeddedBacklog;

/// A fresh database in `dir`, opened as `entrega serve` opens it (full durability),
/// with `clock` and a transport that sends where `targets` allows.
pub async fn sqlite_services(
    dir: &entrega_testkit::TempDir,
    clock: Arc<dyn Clock>,
    targets: TargetPolicy,
) -> (Services, EmbeddedBacklog) {
    crate::serve::open_sqlite_parts(
        &dir.0.join("entrega.db"),
        crate::sqlite::Durability::Full,
        clock,
        Arc::new(HttpTransport::new(targets)),
    )
    .await
    .unwrap()
}

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
    services
        .store
        .create_endpoint(&endpoint, entrega_core::endpoint::MAX_ENDPOINTS_PER_TENANT)
        .await
        .unwrap();
    let event = move || Event {
        id: EventId::generate(),
        tenant_id: tenant.id.clone(),
        event_type: "a.b".into(),
        payload: "{}".into(),
        created_at: Utc::now(),
    };
    (endpoint, event)
}
