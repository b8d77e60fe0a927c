//! Tenants, endpoints and producer transactions for the AWS tests.

use entrega_aws::outbox::outbox_put;
use entrega_core::endpoint::Endpoint;
use entrega_core::event::Event;
use entrega_core::ids::{EventId, TenantId};
use entrega_core::ports::Services;
use entrega_core::retry::RetrySpec;
use entrega_core::tenant::Tenant;

use crate::harness::Stack;

pub async fn tenant(services: &Services) -> TenantId {
    let tenant = Tenant {
        id: TenantId::generate(),
        name: "Acme CRM".into(),
        owner_email: "owner@example.com".into(),
        created_at: services.clock.now(),
    };
    services
        .store
        .create_tenant(&tenant, &format!("hash-{}", tenant.id))
        .await
        .unwrap();
    tenant.id
}

pub async fn endpoint(
    services: &Services,
    tenant: &TenantId,
    url: String,
    retry: RetrySpec,
) -> Endpoint {
    let now = services.clock.now();
    let endpoint = Endpoint {
        retry,
        ..Endpoint::new(tenant.clone(), url, now)
    };

    services
        .store
        .create_endpoint(&endpoint, entrega_core::endpoint::MAX_ENDPOINTS_PER_TENANT)
        .await
        .unwrap();
    endpoint
}

pub fn event(services: &Services, tenant: &TenantId, event_type: &str, payload: &str) -> Event {
    Event {
        id: EventId::generate(),
        tenant_id: tenant.clone(),
        event_type: event_type.into(),
        payload: payload.into(),
        created_at: services.clock.now(),
    }
}

/// The CRM story: a lead moves stage and its event commits in the same transaction.
/// With `stale_stage`, the business write's condition fails and the whole transaction
/// is cancelled.
pub async fn move_lead_stage(stack: &Stack, lead: &str, event: &Event, stale_stage: bool) -> bool {
    use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
    let dynamo = aws_sdk_dynamodb::Client::new(&stack.sdk);
    let business = Put::builder()
        .table_name(&stack.names.main_table)
        .item("pk", AttributeValue::S(format!("LEAD#{lead}")))
        .item("sk", AttributeValue::S("#".into()))
        .item("stage", AttributeValue::S("won".into()))
        .condition_expression(if stale_stage {
            "attribute_exists(pk)"
        } else {
            "attribute_not_exists(pk)"
        })
        .build()
        .unwrap();
    dynamo
        .transact_write_items()
        .transact_items(TransactWriteItem::builder().put(business).build())
        .transact_items(outbox_put(&stack.names.outbox_table, event))
        .send()
        .await
        .is_ok()
}
