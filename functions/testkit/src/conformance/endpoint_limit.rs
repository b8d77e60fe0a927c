//! The per-tenant endpoint limit: checked and taken in one step by the store.

use chrono::Utc;
use entrega_core::endpoint::Endpoint;
use entrega_core::ids::TenantId;
use entrega_core::ports::{EndpointCreated, Store};
use futures_util::future::join_all;

use super::tenant;

/// The limit the test sets: small, so a race at it costs few writes.
const LIMIT: usize = 3;
/// How many creates race for the limit's places.
const RACERS: usize = 10;

fn endpoint(tenant: &TenantId, n: usize) -> Endpoint {
    Endpoint::new(
        tenant.clone(),
        format!("https://hooks.example.com/{n}"),
        Utc::now(),
    )
}

/// Creates the tenant's endpoints racing at once; what each was answered.
async fn race(
    store: &dyn Store,
    tenant: &TenantId,
    racers: usize,
) -> Vec<(Endpoint, EndpointCreated)> {
    let endpoints: Vec<Endpoint> = (0..racers).map(|n| endpoint(tenant, n)).collect();
    let answers = join_all(endpoints.iter().map(|e| store.create_endpoint(e, LIMIT))).await;
    endpoints
        .into_iter()
        .zip(answers.into_iter().map(Result::unwrap))
        .collect()
}

/// Creates racing at the limit store exactly as many as it allows: each one answered
/// `Stored` is there, each one answered `TenantFull` is not, and no other tenant is
/// affected. A delete frees its place once, however often it is repeated.
pub async fn creates_racing_at_the_limit_store_no_more_than_it(store: &dyn Store) {
    let t = tenant(store).await;
    let answers = race(store, &t, RACERS).await;
    let stored: Vec<&Endpoint> = answers
        .iter()
        .filter(|(_, a)| *a == EndpointCreated::Stored)
        .map(|(e, _)| e)
        .collect();
    let told: Vec<EndpointCreated> = answers.iter().map(|(_, a)| *a).collect();
    assert_eq!(stored.len(), LIMIT, "stored exactly the limit: {told:?}");
    for (e, answer) in &answers {
        let found = store.get_endpoint(&e.id).await.unwrap().is_some();
        assert_eq!(
            found,
            *answer == EndpointCreated::Stored,
            "{} was answered {answer:?}",
            e.id
        );
    }
    assert_eq!(store.tenant_endpoints(&t).await.unwrap().len(), LIMIT);

    let other = tenant(store).await;
    assert_eq!(
        store
            .create_endpoint(&endpoint(&other, 0), LIMIT)
            .await
            .unwrap(),
        EndpointCreated::Stored,
        "another tenant's limit is its own"
    );

    // Two deletes of one endpoint, at once and then again, free one place.
    let gone = &stored[0].id;
    let deletes = join_all((0..2).map(|_| store.delete_endpoint(gone))).await;
    assert!(deletes.iter().all(Result::is_ok), "{deletes:?}");
    store.delete_endpoint(gone).await.unwrap();
    let refill = race(store, &t, 2).await;
    let told: Vec<EndpointCreated> = refill.iter().map(|(_, a)| *a).collect();
    let refilled = told
        .iter()
        .filter(|a| **a == EndpointCreated::Stored)
        .count();
    assert_eq!(refilled, 1, "one place was freed: {told:?}");
    assert_eq!(store.tenant_endpoints(&t).await.unwrap().len(), LIMIT);
}
