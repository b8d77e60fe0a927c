//! The JSON shapes the API returns (DESIGN.md's contract), as typed structs built from
//! domain types: the OpenAPI document is derived from these same types, so it cannot
//! drift from what the server sends. Kept apart from the domain so storage fields
//! (versions, leases) never leak out.

use chrono::{DateTime, Utc};
use entrega_core::delivery::Trigger;
use entrega_core::delivery::{Attempt, Delivery};
use entrega_core::endpoint::{DeliveryMode, Endpoint};
use entrega_core::event::{format_timestamp, Event};
use entrega_core::failure::{Failure, FailureReason};
use entrega_core::outcome::FailureKind;
use entrega_core::retry::RetrySpec;
use entrega_core::tenant::Tenant;
use serde::Serialize;
use serde_json::value::RawValue;
use utoipa::ToSchema;

use super::schemas::{DeliveryModeDoc, FailureKindDoc, FailureReasonDoc, RetrySpecDoc, TriggerDoc};

/// Timestamps are RFC 3339 UTC strings with milliseconds.
fn ts(t: DateTime<Utc>) -> String {
    format_timestamp(t)
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TenantView {
    #[schema(pattern = "^ten_[0-9a-f]{32}$")]
    pub id: String,
    pub name: String,
    pub owner_email: String,
    #[schema(format = DateTime)]
    pub created_at: String,
}

impl From<&Tenant> for TenantView {
    fn from(t: &Tenant) -> Self {
        Self {
            id: t.id.to_string(),
            name: t.name.clone(),
            owner_email: t.owner_email.clone(),
            created_at: ts(t.created_at),
        }
    }
}

/// A new tenant and its first API key (shown only here).
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantCreated {
    pub tenant: TenantView,
    pub api_key: String,
}

/// The endpoint as its owner sees it, secret included (it is theirs to verify with).
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointView {
    #[schema(pattern = "^ep_[0-9a-f]{32}$")]
    pub id: String,
    #[schema(pattern = "^ten_[0-9a-f]{32}$")]
    pub tenant_id: String,
    pub url: String,
    pub event_types: Vec<String>,
    #[schema(value_type = DeliveryModeDoc)]
    pub mode: DeliveryMode,
    #[schema(value_type = RetrySpecDoc)]
    pub retry: RetrySpec,
    pub timeout_ms: u32,
    pub max_concurrency: u32,
    pub disabled: bool,
    /// Why Entrega disabled it (410 Gone, failing too long); null if a human did.
    pub disabled_reason: Option<String>,
    pub description: Option<String>,
    /// `whsec_…`: verify signatures with it.
    pub secret: String,
    /// Until when the previous secret (after a rotation) still signs.
    #[schema(format = DateTime)]
    pub previous_secret_expires_at: Option<String>,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub updated_at: String,
}

impl From<&Endpoint> for EndpointView {
    fn from(e: &Endpoint) -> Self {
        Self {
            id: e.id.to_string(),
            tenant_id: e.tenant_id.to_string(),
            url: e.url.clone(),
            event_types: e.event_types.clone(),
            mode: e.mode,
            retry: e.retry.clone(),
            timeout_ms: e.timeout_ms,
            max_concurrency: e.max_concurrency,
            disabled: e.disabled,
            disabled_reason: e.disabled_reason.clone(),
            description: e.description.clone(),
            secret: e.secret.expose().to_owned(),
            previous_secret_expires_at: e.previous_secret.as_ref().map(|p| ts(p.expires_at)),
            created_at: ts(e.created_at),
            updated_at: ts(e.updated_at),
        }
    }
}

/// One row of the delivery log.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryView {
    #[schema(pattern = "^dlv_[0-9a-f]{32}$")]
    pub id: String,
    #[schema(pattern = "^[A-Za-z0-9_:-]{1,128}$")]
    pub event_id: String,
    pub event_type: String,
    #[schema(pattern = "^ep_[0-9a-f]{32}$")]
    pub endpoint_id: String,
    #[schema(pattern = "^ten_[0-9a-f]{32}$")]
    pub tenant_id: String,
    #[schema(value_type = DeliveryStatusDoc)]
    pub status: &'static str,
    /// Attempts in the current generation.
    pub attempt_count: u32,
    pub last_status_code: Option<u16>,
    pub last_error: Option<String>,
    #[schema(format = DateTime)]
    pub next_attempt_at: Option<String>,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub delivered_at: Option<String>,
    /// Bumped by every resend.
    pub generation: u32,
    /// Who asked for the current generation (`admin` or `tenant:<id>`), for a resend.
    pub requested_by: Option<String>,
}

/// The statuses of the delivery log.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatusDoc {
    Pending,
    Delivered,
    Failed,
    Exhausted,
}

impl From<&Delivery> for DeliveryView {
    fn from(d: &Delivery) -> Self {
        Self {
            id: d.id.to_string(),
            event_id: d.event_id.to_string(),
            event_type: d.event_type.clone(),
            endpoint_id: d.endpoint_id.to_string(),
            tenant_id: d.tenant_id.to_string(),
            status: d.state.status().as_str(),
            attempt_count: d.attempt_count,
            last_status_code: d.last_status_code,
            last_error: d.last_error.clone(),
            next_attempt_at: d.next_attempt_at.filter(|_| !d.state.is_terminal()).map(ts),
            created_at: ts(d.created_at),
            delivered_at: d.delivered_at.map(ts),
            generation: d.generation,
            requested_by: d.requested_by.clone(),
        }
    }
}

/// One HTTP attempt.
#[derive(Debug, Serialize, ToSchema)]
pub struct AttemptView {
    /// 1-based within its generation.
    pub number: u32,
    pub generation: u32,
    #[schema(format = DateTime)]
    pub started_at: String,
    pub duration_ms: u64,
    pub status_code: Option<u16>,
    pub error: Option<String>,
    #[schema(value_type = Option<FailureKindDoc>)]
    pub failure_kind: Option<FailureKind>,
    /// The start of the receiver's answer, as text (never to be rendered as HTML).
    pub response_excerpt: Option<String>,
    #[schema(value_type = TriggerDoc)]
    pub trigger: Trigger,
    pub requested_by: Option<String>,
}

impl From<&Attempt> for AttemptView {
    fn from(a: &Attempt) -> Self {
        Self {
            number: a.number,
            generation: a.generation,
            started_at: ts(a.started_at),
            duration_ms: a.duration_ms,
            status_code: a.status_code,
            error: a.error.clone(),
            failure_kind: a.failure_kind,
            response_excerpt: a.response_excerpt.clone(),
            trigger: a.trigger,
            requested_by: a.requested_by.clone(),
        }
    }
}

/// A delivery with every attempt.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryDetail {
    #[serde(flatten)]
    pub delivery: DeliveryView,
    pub attempts: Vec<AttemptView>,
}

/// A dead-letter record.
#[derive(Debug, Serialize, ToSchema)]
pub struct FailureView {
    #[schema(pattern = "^fail_[0-9a-f]{32}$")]
    pub id: String,
    #[schema(pattern = "^ten_[0-9a-f]{32}$")]
    pub tenant_id: String,
    #[schema(pattern = "^dlv_[0-9a-f]{32}$")]
    pub delivery_id: String,
    #[schema(pattern = "^[A-Za-z0-9_:-]{1,128}$")]
    pub event_id: String,
    pub event_type: String,
    #[schema(pattern = "^ep_[0-9a-f]{32}$")]
    pub endpoint_id: String,
    #[schema(value_type = FailureReasonDoc)]
    pub reason: FailureReason,
    /// The event's data (JSON): on `GET /v1/failures/{id}` only. A list leaves it
    /// out, so a page of 200 failures is never 200 payloads of up to 256 KiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Value>)]
    pub payload: Option<Box<RawValue>>,
    pub attempt_times: Vec<String>,
    pub last_status_code: Option<u16>,
    pub last_error: Option<String>,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub acknowledged_at: Option<String>,
    pub ack_note: Option<String>,
    /// Who acknowledged it: `admin`, `tenant:<id>`, or the resend that delivered it.
    pub acknowledged_by: Option<String>,
}

impl FailureView {
    /// The record as a list shows it: without the payload.
    pub fn summary(f: &Failure) -> Self {
        Self {
            payload: None,
            ..Self::from(f)
        }
    }
}

impl From<&Failure> for FailureView {
    fn from(f: &Failure) -> Self {
        Self {
            id: f.id.to_string(),
            tenant_id: f.tenant_id.to_string(),
            delivery_id: f.delivery_id.to_string(),
            event_id: f.event_id.to_string(),
            event_type: f.event_type.clone(),
            endpoint_id: f.endpoint_id.to_string(),
            reason: f.reason,
            payload: Some(as_written(&f.payload)),
            attempt_times: f.attempt_times.iter().map(|t| ts(*t)).collect(),
            last_status_code: f.last_status_code,
            last_error: f.last_error.clone(),
            created_at: ts(f.created_at),
            acknowledged_at: f.acknowledged_at.map(ts),
            ack_note: f.ack_note.clone(),
            acknowledged_by: f.acknowledged_by.clone(),
        }
    }
}

/// An event's data as its producer wrote it (read back through a value, a number past
/// what an `f64` holds came out rounded); `null` if a stored one is not JSON.
fn as_written(payload: &str) -> Box<RawValue> {
    RawValue::from_string(payload.to_owned())
        .unwrap_or_else(|_| RawValue::from_string("null".to_owned()).expect("null is JSON"))
}

/// An event and the status of each of its deliveries.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventView {
    #[schema(pattern = "^[A-Za-z0-9_:-]{1,128}$")]
    pub id: String,
    #[schema(pattern = "^ten_[0-9a-f]{32}$")]
    pub tenant_id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    #[schema(value_type = Value)]
    pub data: Box<RawValue>,
    #[schema(format = DateTime)]
    pub created_at: String,
    pub deliveries: Vec<DeliveryView>,
}

impl EventView {
    pub fn new(e: &Event, deliveries: &[Delivery]) -> Self {
        Self {
            id: e.id.to_string(),
            tenant_id: e.tenant_id.to_string(),
            event_type: e.event_type.clone(),
            data: as_written(&e.payload),
            created_at: ts(e.created_at),
            deliveries: deliveries.iter().map(DeliveryView::from).collect(),
        }
    }
}

/// `202` to a publish: the event's id.
#[derive(Debug, Serialize, ToSchema)]
pub struct Accepted {
    #[schema(pattern = "^[A-Za-z0-9_:-]{1,128}$")]
    pub id: String,
}

/// One page of a newest-first list; `next_cursor` continues it.
#[derive(Debug, Serialize, ToSchema)]
pub struct Page<T: ToSchema> {
    pub data: Vec<T>,
    pub next_cursor: Option<String>,
}

impl<T: ToSchema> Page<T> {
    pub fn of<S>(page: entrega_core::ports::Page<S>, view: impl Fn(&S) -> T) -> Self {
        Self {
            data: page.data.iter().map(view).collect(),
            next_cursor: page.next_cursor,
        }
    }
}

/// The answer to a batch resend.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, ToSchema)]
pub struct BatchResent {
    /// Deliveries queued by this request.
    pub queued: u64,
    /// Ids given that name no delivery this key may see.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_found: Vec<String>,
    /// Deliveries left as they are because their endpoint was deleted (nothing could
    /// send them); the rest of the batch goes on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoint_deleted: Vec<String>,
    /// Deliveries left as they are because an attempt is under way and their endpoint
    /// takes each event at most once (a resend could deliver it twice); resend them
    /// once it ends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempt_under_way: Vec<String>,
    /// Where to continue a filtered batch; null when done.
    pub next_cursor: Option<String>,
}

/// Liveness, and what is failing when degraded.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok`, or `degraded` (then with status 503).
    pub status: String,
    /// Deliveries and events waiting, across tenants (embedded runtime).
    pub waiting: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<HealthReason>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct HealthReason {
    pub component: String,
    pub reason: String,
    #[schema(format = DateTime)]
    pub since: String,
    pub occurrences: u64,
}
