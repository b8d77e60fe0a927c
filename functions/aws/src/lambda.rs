//! The event glue of the three queue- and stream-driven functions, with Lambda's batch
//! semantics (ReportBatchItemFailures). The Lambda binaries call these with the events
//! Lambda hands them; `entrega serve --backend aws` builds the same events from its
//! pollers and calls the same functions, so both run one code path.

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use entrega_core::handlers::failures::handle_failure;
use entrega_core::handlers::fanout::fan_out;
use entrega_core::handlers::worker::{handle_delivery, Disposition};
use entrega_core::ports::{Hooked, MessageQueue, OutgoingMessage, Services};
use entrega_runtime::Settlement;
use futures_util::future::join_all;
use serde_json::Value;

use std::sync::Arc;

use crate::batch_buffers::{BacklogBuffer, SendBuffer};
use crate::outbox::event_from_dynamo_json;
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

/// The outbox trigger. Records are handled in order; on a failure the rest of the
/// batch is reported from the failed record on (a stream is ordered: Lambda retries
/// from that sequence number, and fan-out is idempotent for the ones replayed).
///
/// The records' delivery messages are held and sent ten to a call ([`SendBuffer`]):
/// once at least ten are held, and at the end. A record counts as done only once its
/// messages are sent, so a failed send reports the batch from the first record whose
/// messages were held.
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

async fn fan_out_records(
    batched: &Services,
    buffer: &SendBuffer,
    quarantine: &dyn MessageQueue,
    records: Vec<OutboxRecord>,
) -> DynamoDbEventResponse {
    let mut response = DynamoDbEventResponse::default();
    // The first record whose messages are held, not yet sent.
    let mut unsent_from: Option<String> = None;
    let fail_from = |response: &mut DynamoDbEventResponse, sequence: String| {
        let mut failure = DynamoDbBatchItemFailure::default();
        failure.item_identifier = Some(sequence);
        response.batch_item_failures.push(failure);
    };
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
                // What earlier records hold is sent first: a replay from before this
                // record would quarantine it (and count it) twice.
                if let Some(from) = flush(buffer, &mut unsent_from).await {
                    fail_from(&mut response, from);
                    return response;
                }
                tracing::error!(sequence = %record.sequence_number, error = %e, "quarantining a malformed outbox item");
                let message = OutgoingMessage {
                    body: serde_json::json!({
                        "kind": "malformed_outbox_item",
                        "reason": e.to_string(),
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
                    // Nothing is held: what came before was sent just above.
                    tracing::error!(error = %e, "the outbox DLQ refused a malformed item; the batch resumes here");
                    fail_from(&mut response, record.sequence_number);
                    return response;
                }
                batched.metrics.outbox_item_refused();
                continue;
            }
        };
        if let Err(e) = fan_out(batched, &event).await {
            tracing::error!(event_id = %event.id, error = %e, "fan-out failed; the batch resumes here");
            let from = flushed_or(buffer, &mut unsent_from, record.sequence_number).await;
            fail_from(&mut response, from);
            return response;
        }
        if buffer.held() > 0 && unsent_from.is_none() {
            unsent_from = Some(record.sequence_number);
        }
        if buffer.held() >= SEND_BATCH {
            if let Some(from) = flush(buffer, &mut unsent_from).await {
                fail_from(&mut response, from);
                return response;
            }
        }
    }
    if let Some(from) = flush(buffer, &mut unsent_from).await {
        fail_from(&mut response, from);
    }
    response
}

/// Send what the buffer holds; on a failure, the record to report the batch from.
async fn flush(buffer: &SendBuffer, unsent_from: &mut Option<String>) -> Option<String> {
    match buffer.flush().await {
        Ok(()) => {
            *unsent_from = None;
            None
        }
        Err(e) => {
            tracing::error!(error = %e, "sending the batch's delivery messages failed; the batch resumes at the first record they came from");
            unsent_from.take()
        }
    }
}

/// Record `failed` failed: send what the records before it queued, and report the
/// batch from `failed`, or from an earlier record whose messages did not go out.
async fn flushed_or(
    buffer: &SendBuffer,
    unsent_from: &mut Option<String>,
    failed: String,
) -> String {
    flush(buffer, unsent_from).await.unwrap_or(failed)
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
