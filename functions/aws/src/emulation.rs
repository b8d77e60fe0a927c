//! Lambda's event source mappings and EventBridge Scheduler, played locally, so that
//! `entrega serve --backend aws` runs the Lambda functions' own handlers against AWS
//! APIs (an emulator or a real account) without deploying anything:
//!
//! - the outbox table's stream → [`outbox_batch`], resuming at a reported failure;
//! - each queue → an SQS batch event → [`delivery_batch`] / [`failure_batch`], then
//!   deleting exactly the messages not reported as failures (Lambda's semantics); the
//!   delivery queue's batches [`DELIVERY_POLLERS`] at a time, as concurrent invocations;
//! - schedules that are due → their input sent to the target queue, then deleted
//!   (emulators store schedules but never fire them).

use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use chrono::{DateTime, NaiveDateTime, Utc};
use entrega_core::handlers::sweep::SWEEP_INTERVAL;
use entrega_core::ports::{Services, StoreError};
use entrega_runtime::{pause, poll_until_stopped, AGE_CHECK_INTERVAL};
use serde_json::Value;
use tokio::sync::watch;

use crate::lambda::{
    analyzer_event, delivery_batch, failure_batch, outbox_batch, OutboxRecord, SWEEP_TASK,
};
use crate::outbox::scalar_json;
use crate::resources::AwsResources;
use crate::stream_checkpoints::StreamCheckpoints;

/// Records per stream read, as a stream event source mapping's batch size.
const STREAM_BATCH: i32 = 100;
/// Messages per SQS batch event (SQS's receive maximum).
const SQS_BATCH: i32 = 10;
/// Delivery batches handled side by side, each by a poller of its own: Lambda's event
/// source mapping runs up to its maximum concurrency of invocations at once (the
/// template's `WorkerConcurrency`), and a batch lasts as long as its slowest attempt.
/// With one poller, one endpoint that hangs held every other tenant's messages for
/// its whole timeout. Sixteen on one machine: each idle poller long-polls the queue.
pub const DELIVERY_POLLERS: usize = 16;
/// The slow endpoints' share of the pollers, as the Lambda worker's of its
/// concurrency ([`crate::function::slow_endpoint_share`]).
pub const SLOW_ENDPOINT_SHARE: u32 = crate::function::slow_endpoint_share(DELIVERY_POLLERS as u32);
/// One endpoint's share of the pollers, as the Lambda worker's of its concurrency
/// ([`crate::function::one_endpoint_share`]).
pub const ONE_ENDPOINT_SHARE: u32 = crate::function::one_endpoint_share(DELIVERY_POLLERS as u32);
/// Pause when a poll found nothing.
const IDLE: Duration = Duration::from_millis(200);
/// How often due schedules are looked for.
const SCHEDULE_POLL: Duration = Duration::from_secs(1);

/// The pollers' shared context.
#[derive(Clone)]
pub struct Emulation {
    pub services: Services,
    pub resources: AwsResources,
    pub clients: crate::resources::AwsClients,
}

impl Emulation {
    /// Run every poller until `shutdown` turns true. The handlers keep the slow
    /// endpoints' share of these pollers, and one endpoint's, as the Lambda worker
    /// keeps its own, unless the caller set shares of its own (the cost bench prices
    /// the deployed worker's).
    pub async fn run(mut self, shutdown: watch::Receiver<bool>) {
        let settings = &mut self.services.settings;
        if settings.slow_endpoint_share == 0 {
            settings.slow_endpoint_share = SLOW_ENDPOINT_SHARE;
        }
        if settings.one_endpoint_share == 0 {
            settings.one_endpoint_share = ONE_ENDPOINT_SHARE;
        }
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(self.clone().stream_loop(shutdown.clone()));
        for _ in 0..DELIVERY_POLLERS {
            tasks.spawn(self.clone().queue_loop(true, shutdown.clone()));
        }
        tasks.spawn(self.clone().queue_loop(false, shutdown.clone()));
        tasks.spawn(self.schedule_loop(shutdown));
        while tasks.join_next().await.is_some() {}
    }

    async fn stream_loop(self, shutdown: watch::Receiver<bool>) {
        let streams = self.clients.streams.clone();
        let dynamo = self.clients.dynamo.clone();
        // Per shard: the sequence number to resume after, kept across restarts.
        let checkpoints = tokio::sync::Mutex::new(StreamCheckpoints::new(
            dynamo.clone(),
            self.resources.main_table.clone(),
        ));
        poll_until_stopped(
            shutdown,
            IDLE,
            || async {
                let mut checkpoints = checkpoints.lock().await;
                self.stream_pass(&dynamo, &streams, &mut checkpoints)
                    .await
                    .map(|n| n > 0)
                    .map_err(|e| StoreError::Backend(e.to_string()))
            },
            |result| {
                if let Err(e) = result {
                    tracing::error!(error = %e, "reading the outbox stream failed");
                }
            },
        )
        .await;
    }

    async fn stream_pass(
        &self,
        dynamo: &aws_sdk_dynamodb::Client,
        streams: &aws_sdk_dynamodbstreams::Client,
        checkpoints: &mut StreamCheckpoints,
    ) -> Result<usize, String> {
        let table = dynamo
            .describe_table()
            .table_name(&self.resources.outbox_table)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let arn = table
            .table()
            .and_then(|t| t.latest_stream_arn())
            .ok_or("the outbox table has no stream")?
            .to_owned();
        let stream = streams
            .describe_stream()
            .stream_arn(&arn)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let shards: Vec<String> = stream
            .stream_description()
            .map(|d| {
                d.shards()
                    .iter()
                    .filter_map(|s| s.shard_id().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let mut handled = 0;
        for shard in shards {
            let mut iterator = streams
                .get_shard_iterator()
                .stream_arn(&arn)
                .shard_id(&shard);
            iterator = match checkpoints.get(&shard).await? {
                Some(seq) => iterator
                    .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                    .sequence_number(seq),
                None => iterator.shard_iterator_type(ShardIteratorType::TrimHorizon),
            };
            let it = iterator.send().await.map_err(|e| e.to_string())?;
            let Some(it) = it.shard_iterator() else {
                continue;
            };
            let out = streams
                .get_records()
                .shard_iterator(it)
                .limit(STREAM_BATCH)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let records: Vec<OutboxRecord> = out
                .records()
                .iter()
                .filter_map(|r| {
                    let change = r.dynamodb()?;
                    let image: serde_json::Map<String, Value> = change
                        .new_image()
                        .map(|img| {
                            img.iter()
                                .map(|(k, v)| (k.clone(), stream_scalar_json(v)))
                                .collect()
                        })
                        .unwrap_or_default();
                    Some(OutboxRecord {
                        sequence_number: change.sequence_number()?.to_owned(),
                        event_name: r
                            .event_name()
                            .map(|n| n.as_str().to_owned())
                            .unwrap_or_default(),
                        new_image: Value::Object(image),
                    })
                })
                .collect();
            if records.is_empty() {
                continue;
            }
            let quarantine = crate::sqs::SqsQueue::new(
                self.clients.sqs.clone(),
                self.resources.outbox_dlq_url.clone(),
            );
            let response = outbox_batch(&self.services, &quarantine, records.clone()).await;
            let failed = response
                .batch_item_failures
                .first()
                .and_then(|f| f.item_identifier.clone());
            // Checkpoint up to (not including) the first failure: the next pass resumes there.
            let done = records
                .iter()
                .take_while(|r| Some(&r.sequence_number) != failed.as_ref());
            if let Some(last) = done.last() {
                handled += 1;
                checkpoints.set(&shard, &last.sequence_number).await?;
            }
        }
        Ok(handled)
    }

    async fn queue_loop(self, deliveries: bool, shutdown: watch::Receiver<bool>) {
        let url = if deliveries {
            self.resources.delivery_queue_url.clone()
        } else {
            self.resources.failure_queue_url.clone()
        };
        // The receive's long poll is the idle wait.
        poll_until_stopped(
            shutdown,
            Duration::ZERO,
            || self.queue_pass(&url, deliveries),
            |result| {
                if let Err(e) = result {
                    tracing::error!(error = %e, "receiving from the queue failed");
                }
            },
        )
        .await;
    }

    /// One receive, its batch handled as Lambda would hand it over, and the batch's
    /// successes deleted; `Ok(true)` if a message came.
    async fn queue_pass(&self, url: &str, deliveries: bool) -> Result<bool, StoreError> {
        let sqs = &self.clients.sqs;
        // The queue's own visibility timeout applies, as with a Lambda trigger.
        let out = match sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(SQS_BATCH)
            .wait_time_seconds(1)
            .message_system_attribute_names(
                aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount,
            )
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) => {
                return Err(StoreError::Backend(format!(
                    "receive: {}",
                    aws_sdk_sqs::error::DisplayErrorContext(e)
                )))
            }
        };
        if out.messages().is_empty() {
            return Ok(false);
        }
        let mut event = SqsEvent::default();
        for m in out.messages() {
            let mut message = SqsMessage::default();
            message.message_id = m.message_id().map(str::to_owned);
            message.receipt_handle = m.receipt_handle().map(str::to_owned);
            message.body = m.body().map(str::to_owned);
            // Lambda's events carry the system attributes by their names.
            message.attributes = m
                .attributes()
                .into_iter()
                .flatten()
                .map(|(name, value)| (name.as_str().to_owned(), value.clone()))
                .collect();
            event.records.push(message);
        }
        let records = event.records.clone();
        let response = if deliveries {
            delivery_batch(&self.services, event).await
        } else {
            failure_batch(&self.services, event).await
        };
        let failed: Vec<&str> = response
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.as_str())
            .collect();
        // As Lambda's event source mapping does: the batch's successes deleted in
        // one call (up to 10, the receive's own batch size).
        let entries: Vec<_> = records
            .iter()
            .filter(|r| !failed.contains(&r.message_id.as_deref().unwrap_or_default()))
            .enumerate()
            .filter_map(|(i, r)| {
                aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(r.receipt_handle.clone().unwrap_or_default())
                    .build()
                    .ok()
            })
            .collect();
        if entries.is_empty() {
            return Ok(true);
        }
        match sqs
            .delete_message_batch()
            .queue_url(url)
            .set_entries(Some(entries))
            .send()
            .await
        {
            Ok(out) if !out.failed().is_empty() => {
                tracing::error!(
                    failed = out.failed().len(),
                    "some deletes failed; those messages will return"
                );
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %aws_sdk_sqs::error::DisplayErrorContext(e), "delete failed; the messages will return");
            }
        }
        Ok(true)
    }

    async fn schedule_loop(self, mut shutdown: watch::Receiver<bool>) {
        let scheduler = self.clients.scheduler.clone();
        let sqs = self.clients.sqs.clone();
        let mut last_age_check = std::time::Instant::now() - AGE_CHECK_INTERVAL;
        let mut last_sweep = std::time::Instant::now();
        while !*shutdown.borrow() {
            if let Err(e) = self.fire_due_schedules(&scheduler, &sqs).await {
                tracing::error!(error = %e, "firing schedules failed");
            }
            // The template's rate(…) schedules on the dlq-analyzer, played here with
            // the same inputs (each logs its own failure).
            if last_age_check.elapsed() >= AGE_CHECK_INTERVAL {
                last_age_check = std::time::Instant::now();
                analyzer_event(&self.services, serde_json::json!({})).await;
            }
            if last_sweep.elapsed() >= SWEEP_INTERVAL {
                last_sweep = std::time::Instant::now();
                let sweep = serde_json::json!({ "entrega_task": SWEEP_TASK });
                analyzer_event(&self.services, sweep).await;
            }
            pause(&mut shutdown, SCHEDULE_POLL).await;
        }
    }

    /// Send every due schedule's input to its target queue and delete the schedule
    /// (what `ActionAfterCompletion: DELETE` does). Returns how many fired.
    pub async fn fire_due_schedules(
        &self,
        scheduler: &aws_sdk_scheduler::Client,
        sqs: &aws_sdk_sqs::Client,
    ) -> Result<usize, String> {
        let now = self.services.clock.now();
        let listed = scheduler
            .list_schedules()
            .group_name(&self.resources.schedule_group)
            .send()
            .await
            .map_err(|e| aws_sdk_scheduler::error::DisplayErrorContext(e).to_string())?;
        let mut fired = 0;
        for summary in listed.schedules() {
            let Some(name) = summary.name() else { continue };
            let schedule = scheduler
                .get_schedule()
                .group_name(&self.resources.schedule_group)
                .name(name)
                .send()
                .await
                .map_err(|e| aws_sdk_scheduler::error::DisplayErrorContext(e).to_string())?;
            let due = schedule
                .schedule_expression()
                .and_then(parse_at)
                .is_some_and(|at| at <= now);
            let Some(target) = schedule.target().filter(|_| due) else {
                continue;
            };
            if target.arn() != self.resources.delivery_queue_arn {
                tracing::warn!(
                    schedule = name,
                    arn = target.arn(),
                    "a schedule targets an unknown queue"
                );
                continue;
            }
            sqs.send_message()
                .queue_url(&self.resources.delivery_queue_url)
                .message_body(target.input().unwrap_or_default())
                .set_message_group_id(
                    target
                        .sqs_parameters()
                        .and_then(|p| p.message_group_id())
                        .map(str::to_owned),
                )
                .send()
                .await
                .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(e).to_string())?;
            scheduler
                .delete_schedule()
                .group_name(&self.resources.schedule_group)
                .name(name)
                .send()
                .await
                .map_err(|e| aws_sdk_scheduler::error::DisplayErrorContext(e).to_string())?;
            fired += 1;
        }
        Ok(fired)
    }
}

/// The time of an `at(yyyy-mm-ddThh:mm:ss)` expression (UTC).
pub fn parse_at(expression: &str) -> Option<DateTime<Utc>> {
    let inner = expression.strip_prefix("at(")?.strip_suffix(')')?;
    NaiveDateTime::parse_from_str(inner, "%Y-%m-%dT%H:%M:%S")
        .ok()
        .map(|t| t.and_utc())
}

/// DynamoDB JSON of a stream SDK attribute (the outbox has only S and N).
fn stream_scalar_json(value: &aws_sdk_dynamodbstreams::types::AttributeValue) -> Value {
    use aws_sdk_dynamodbstreams::types::AttributeValue as Stream;
    let as_table = match value {
        Stream::S(v) => aws_sdk_dynamodb::types::AttributeValue::S(v.clone()),
        Stream::N(v) => aws_sdk_dynamodb::types::AttributeValue::N(v.clone()),
        _ => return Value::Null,
    };
    scalar_json(&as_table)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::at_expression;

    #[test]
    fn at_expressions_round_trip() {
        let t = DateTime::parse_from_rfc3339("2026-12-01T10:00:07Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(parse_at(&at_expression(t)), Some(t));
        assert_eq!(parse_at("rate(5 minutes)"), None);
    }
}
