//! The event glue of the three queue- and stream-driven functions, with Lambda's batch
//! semantics (ReportBatchItemFailures). The Lambda binaries call these with the events
//! Lambda hands them; `entrega serve --backend aws` builds the same events from its
//! pollers and calls the same functions, so both run one code path.

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use entrega_core::endpoint::Endpoint;
use entrega_core::event::Event;
use entrega_core::handlers::failures::handle_failure;
use entrega_core::handlers::fanout::fan_out_to;
use entrega_core::handlers::worker::{handle_delivery, Disposition};
use entrega_core::ids::TenantId;
use entrega_core::ports::{Hooked, MessageQueue, OutgoingMessage, Services, StoreResult};
use entrega_runtime::Settlement;
use futures_util::future::join_all;
use serde_json::Value;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OnceCell;

use crate::batch_buffers::{BacklogBuffer, SendBuffer};
use crate::outbox::{event_from_dynamo_json, OutboxError};
use crate::sqs::SEND_BATCH;

/// One stream record as the outbox trigger needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxRecord {
    pub sequence_number: String,
    /// `INSERT`, `MODIFY` or `REMOVE`.
    pub event_name: String,
    /// The new image in DynamoDB JSON.
    pub new_image: Value,
}

/// The records of a Lambda DynamoDB stream event.
pub fn outbox_records(event: aws_lambda_events::event::dynamodb::Event) -> Vec<OutboxRecord> {
    event
        .records
        .into_iter()
        .map(|r| OutboxRecord {
            sequence_number: r.change.sequence_number.unwrap_or_default(),
            event_name: r.event_name,
            new_image: serde_json::to_value(&r.change.new_image).unwrap_or(Value::Null),
        })
        .collect()
}

/// The outbox trigger. Records are fanned out [`FAN_OUTS_AT_ONCE`] at a time, in
/// stream order from one group to the next; on a failure the batch is reported from
/// the first failed record of its group on (a stream is ordered: Lambda retries from
/// that sequence number, and fan-out is idempotent for the ones replayed).
///
/// Why at once: each fan-out waits for its store calls (the tenant's endpoints, a
/// conditional create per endpoint), a few milliseconds each on AWS; one after
/// another, a stream shard fanned out about seventy events a second (README, "The
/// fan-out's pace"), and one tenant's burst held every other tenant's events behind
/// it for as long as it took.
///
/// Each tenant's endpoints are read once for the batch ([`BatchEndpoints`]). The
/// records' delivery messages are held and sent when their group is done, ten to a
/// call ([`SendBuffer`]). A record counts as done only once its messages are sent, so
/// a failed send reports the batch from the group's first record.
pub async fn outbox_batch(
    services: &Services,
    quarantine: &dyn MessageQueue,
    records: Vec<OutboxRecord>,
) -> DynamoDbEventResponse {
    let buffer = Arc::new(Hooked(SendBuffer::new(services.deliveries.clone())));
    let backlog = Arc::new(BacklogBuffer::new(services.backlog.clone()));
    let batched = Services {
        deliveries: buffer.clone(),
        backlog: backlog.clone(),
        ..services.clone()
    };
    let response = fan_out_records(&batched, &buffer, quarantine, records).await;
    // After the sends: a tenant's figure never counts messages that were not sent.
    backlog.flush().await;
    response
}

/// Records fanned out at once: as many as one send takes messages when each event
/// has one endpoint, so a group's messages are one `SendMessageBatch`.
const FAN_OUTS_AT_ONCE: usize = SEND_BATCH;

async fn fan_out_records(
    batched: &Services,
    buffer: &SendBuffer,
    quarantine: &dyn MessageQueue,
    records: Vec<OutboxRecord>,
) -> DynamoDbEventResponse {
    let mut response = DynamoDbEventResponse::default();
    let fail_from = |mut response: DynamoDbEventResponse, sequence: String| {
        let mut failure = DynamoDbBatchItemFailure::default();
        failure.item_identifier = Some(sequence);
        response.batch_item_failures.push(failure);
        response
    };
    let endpoints = BatchEndpoints::default();
    let mut group: Vec<(String, Event)> = Vec::with_capacity(FAN_OUTS_AT_ONCE);
    for record in records {
        // Only inserts are events; TTL removals and updates never trigger anything.
        if record.event_name != "INSERT" {
            continue;
        }
        let event = match event_from_dynamo_json(&record.new_image) {
            Ok(event) => event,
            Err(e) => {
                // A malformed producer item can never become an event; retrying it
                // would block the shard for every tenant behind it. It goes to the
                // outbox DLQ (alarmed) with the reason, so nothing vanishes unseen; if
                // even that fails, the batch stops here and Lambda retries it.
                //
                // The records before it are fanned out and sent first: a replay from
                // before this record would quarantine it (and count it) twice.
                let before = std::mem::take(&mut group);
                if let Some(from) = fan_out_group(batched, buffer, &endpoints, before).await {
                    return fail_from(response, from);
                }
                if !quarantined(batched, quarantine, &record, &e).await {
                    return fail_from(response, record.sequence_number);
                }
                continue;
            }
        };
        group.push((record.sequence_number, event));
        if group.len() == FAN_OUTS_AT_ONCE {
            let full = std::mem::take(&mut group);
            if let Some(from) = fan_out_group(batched, buffer, &endpoints, full).await {
                return fail_from(response, from);
            }
        }
    }
    if let Some(from) = fan_out_group(batched, buffer, &endpoints, group).await {
        response = fail_from(response, from);
    }
    response
}

/// Fan `group` out at once, then send the messages it made; the record to replay the
/// batch from, if any of it failed. The messages of the records that were fanned out
/// go out even when one failed: records after it are replayed all the same, and find
/// their deliveries made and queued (the worker tolerates the duplicate message).
async fn fan_out_group(
    batched: &Services,
    buffer: &SendBuffer,
    endpoints: &BatchEndpoints,
    group: Vec<(String, Event)>,
) -> Option<String> {
    let first = group.first()?.0.clone();
    let results = join_all(group.iter().map(|(_, event)| async move {
        let listed = endpoints.of(batched, &event.tenant_id).await?;
        fan_out_to(batched, event, &listed).await
    }))
    .await;
    let failed = group.iter().zip(&results).find_map(|((sequence, event), result)| {
        let e = result.as_ref().err()?;
        tracing::error!(event_id = %event.id, error = %e, "fan-out failed; the batch resumes here");
        Some(sequence.clone())
    });
    match buffer.flush().await {
        Ok(()) => failed,
        Err(e) => {
            tracing::error!(error = %e, "sending the batch's delivery messages failed; the batch resumes at the first record they came from");
            Some(first)
        }
    }
}

/// Send a malformed outbox item to the outbox DLQ with why it was refused; `false` if
/// the DLQ refused it too.
async fn quarantined(
    batched: &Services,
    quarantine: &dyn MessageQueue,
    record: &OutboxRecord,
    error: &OutboxError,
) -> bool {
    tracing::error!(sequence = %record.sequence_number, error = %error, "quarantining a malformed outbox item");
    let message = OutgoingMessage {
        body: serde_json::json!({
            "kind": "malformed_outbox_item",
            "reason": error.to_string(),
            "sequence_number": record.sequence_number,
            "new_image": record.new_image,
        })
        .to_string(),
        group: "outbox".into(),
        delay: std::time::Duration::ZERO,
        concurrency_key: None,
        concurrency_limit: 0,
    };
    if let Err(e) = quarantine.send(vec![message]).await {
        tracing::error!(error = %e, "the outbox DLQ refused a malformed item; the batch resumes here");
        return false;
    }
    batched.metrics.outbox_item_refused();
    true
}

/// Each tenant's endpoints, read once for a stream batch. Every event in the batch was
/// published before the batch was read, so a list read after that holds every
/// endpoint any of them may go to (read per event, a batch of one tenant's events
/// read the same list a hundred times, each a query and a batch read).
#[derive(Default)]
struct BatchEndpoints(Mutex<HashMap<TenantId, Arc<TenantEndpoints>>>);

/// One tenant's endpoints, once read.
type TenantEndpoints = OnceCell<Arc<Vec<Endpoint>>>;

impl BatchEndpoints {
    async fn of(&self, services: &Services, tenant: &TenantId) -> StoreResult<Arc<Vec<Endpoint>>> {
        let cell = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(tenant.clone())
            .or_default()
            .clone();
        // Concurrent records of one tenant wait for one read; a failed read is tried
        // again by the next record that asks.
        cell.get_or_try_init(|| async {
            services.store.tenant_endpoints(tenant).await.map(Arc::new)
        })
        .await
        .cloned()
    }
}

/// The delivery worker over an SQS batch, every message at once: each endpoint's cap
/// holds across invocations through its slots in the store (the worker hides a message
/// whose endpoint is busy), so nothing here waits. A message to retry later is hidden
/// with ChangeMessageVisibility and reported failed (so Lambda keeps it); one that is
/// done is left for Lambda to delete.
pub async fn delivery_batch(services: &Services, event: SqsEvent) -> SqsBatchResponse {
    let backlog = Arc::new(BacklogBuffer::new(services.backlog.clone()));
    let batched = Services {
        backlog: backlog.clone(),
        ..services.clone()
    };
    let services = &batched;
    let jobs = event.records.into_iter().map(|message| async move {
        let body = message.body.clone().unwrap_or_default();
        let receives = receive_count(&message);
        let outcome = handle_delivery(services, &body, receives).await;
        if let Err(e) = &outcome {
            tracing::error!(error = %e, "delivery handler failed; the message will return");
        }
        settle(
            services.deliveries.as_ref(),
            &message,
            Settlement::of(&outcome, receives, services.random.as_ref()),
        )
        .await
    });
    let mut response = SqsBatchResponse::default();
    for id in join_all(jobs).await.into_iter().flatten() {
        response.add_failure(id);
    }
    backlog.flush().await;
    response
}

/// The failure handler (DLQ analyzer) over an SQS batch.
pub async fn failure_batch(services: &Services, event: SqsEvent) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    for message in event.records {
        let body = message.body.clone().unwrap_or_default();
        let outcome = handle_failure(services, &body)
            .await
            .map(|_| Disposition::Done);
        if let Err(e) = &outcome {
            tracing::error!(error = %e, "failure handler failed; the notice will return");
        }
        let settlement =
            Settlement::of(&outcome, receive_count(&message), services.random.as_ref());
        if let Some(id) = settle(services.failures.as_ref(), &message, settlement).await {
            response.add_failure(id);
        }
    }
    response
}

/// Lambda deletes the batch's successes itself: a message to keep is hidden for its
/// delay and reported failed (its id returned), so Lambda leaves it in the queue.
async fn settle(
    queue: &dyn entrega_core::ports::MessageQueue,
    message: &SqsMessage,
    settlement: Settlement,
) -> Option<String> {
    match settlement {
        Settlement::Delete => None,
        Settlement::Hide(_) => {
            let receipt = message.receipt_handle.as_deref().unwrap_or_default();
            settlement.apply(queue, receipt).await;
            Some(message_id(message))
        }
    }
}

/// The sweep schedule's input (the template's `Sweep` event).
pub const SWEEP_TASK: &str = "sweep";

/// What the dlq-analyzer function receives: an SQS batch from the failures queue, the
/// sweep schedule's `{"entrega_task": "sweep"}`, or the schedule's tick that runs the
/// 24-hour rule (any other event).
pub async fn analyzer_event(services: &Services, event: serde_json::Value) -> serde_json::Value {
    if event.get("entrega_task").and_then(Value::as_str) == Some(SWEEP_TASK) {
        return match entrega_core::handlers::sweep::sweep_overdue(services).await {
            Ok(report) => {
                serde_json::json!({ "examined": report.examined, "requeued": report.requeued })
            }
            Err(e) => {
                tracing::error!(error = %e, "the sweep failed; the next one starts over");
                serde_json::Value::Null
            }
        };
    }
    if event.get("Records").is_some() {
        match serde_json::from_value::<SqsEvent>(event) {
            Ok(batch) => {
                serde_json::to_value(failure_batch(services, batch).await).unwrap_or_default()
            }
            Err(e) => {
                tracing::error!(error = %e, "an SQS event that does not parse");
                serde_json::Value::Null
            }
        }
    } else {
        match entrega_core::handlers::age::check_unacknowledged(services).await {
            Ok(age) => {
                serde_json::json!({ "oldest_unacknowledged_failure_age_s": age.map(|a| a.as_secs()) })
            }
            Err(e) => {
                tracing::error!(error = %e, "the 24-hour check failed");
                serde_json::Value::Null
            }
        }
    }
}

/// How many times SQS has handed this message out, this time included.
fn receive_count(message: &SqsMessage) -> u32 {
    message
        .attributes
        .get("ApproximateReceiveCount")
        .and_then(|count| count.parse().ok())
        .unwrap_or(1)
}

fn message_id(message: &SqsMessage) -> String {
    message.message_id.clone().unwrap_or_default()
}

#[cfg(test)]
#[path = "lambda_tests.rs"]
mod tests;
