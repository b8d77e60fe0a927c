//! EventBridge Scheduler for retries further off than SQS can delay a message (15
//! minutes): a one-time `at(...)` schedule that sends the task back to the delivery
//! queue in the tenant's message group (fair queueing holds for scheduled retries),
//! retries the send for a day, dead-letters what it still cannot send, and deletes
//! itself after it fires.

use async_trait::async_trait;
use aws_sdk_scheduler::types::{
    ActionAfterCompletion, DeadLetterConfig, FlexibleTimeWindow, FlexibleTimeWindowMode,
    RetryPolicy, SqsParameters, Target,
};
use aws_sdk_scheduler::Client;
use chrono::{DateTime, Duration as ChronoDuration, Timelike, Utc};
use entrega_core::ports::{LongDelayScheduler, OutgoingMessage, StoreError, StoreResult};

use crate::dynamo::backend;

/// Where schedules go and what they may do.
#[derive(Clone)]
pub struct EventBridgeScheduler {
    client: Client,
    group: String,
    /// The role Scheduler assumes to send to the queue (needs `sqs:SendMessage`).
    role_arn: String,
    queue_arn: String,
    /// Where a retry goes when Scheduler cannot send it (the delivery DLQ, alarmed).
    dead_letter_arn: String,
}

/// How long Scheduler keeps trying to send a due retry (its maximum), and how often.
const SEND_RETRY_AGE_SECONDS: i32 = 86_400;
const SEND_RETRY_ATTEMPTS: i32 = 185;

impl EventBridgeScheduler {
    pub fn new(
        client: Client,
        group: String,
        role_arn: String,
        queue_arn: String,
        dead_letter_arn: String,
    ) -> Self {
        Self {
            client,
            group,
            role_arn,
            queue_arn,
            dead_letter_arn,
        }
    }
}

/// `at(yyyy-mm-ddThh:mm:ss)` for `at`, rounded up to the second: never earlier than
/// the retry policy (or the receiver's Retry-After) asked.
pub fn at_expression(at: DateTime<Utc>) -> String {
    let rounded = if at.nanosecond() > 0 {
        at.with_nanosecond(0).expect("0 ns is valid") + ChronoDuration::seconds(1)
    } else {
        at
    };
    format!("at({})", rounded.format("%Y-%m-%dT%H:%M:%S"))
}

/// A name unique per retry and stable across a replay (so a replayed requeue meets a
/// conflict instead of scheduling twice). Names allow `[0-9a-zA-Z-_.]`, ≤ 64 chars.
fn schedule_name(message: &OutgoingMessage, at: DateTime<Utc>) -> String {
    let task: serde_json::Value = serde_json::from_str(&message.body).unwrap_or_default();
    let delivery = task["delivery_id"].as_str().unwrap_or("task");
    let generation = task["generation"].as_u64().unwrap_or(0);
    format!("{delivery}-{generation}-{}", at.timestamp())
}

#[async_trait]
impl LongDelayScheduler for EventBridgeScheduler {
    async fn schedule(&self, message: OutgoingMessage, at: DateTime<Utc>) -> StoreResult<()> {
        let target = Target::builder()
            .arn(&self.queue_arn)
            .role_arn(&self.role_arn)
            .input(&message.body)
            .sqs_parameters(
                SqsParameters::builder()
                    .message_group_id(&message.group)
                    .build(),
            )
            .retry_policy(
                RetryPolicy::builder()
                    .maximum_event_age_in_seconds(SEND_RETRY_AGE_SECONDS)
                    .maximum_retry_attempts(SEND_RETRY_ATTEMPTS)
                    .build(),
            )
            .dead_letter_config(
                DeadLetterConfig::builder()
                    .arn(&self.dead_letter_arn)
                    .build(),
            )
            .build()
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        let window = FlexibleTimeWindow::builder()
            .mode(FlexibleTimeWindowMode::Off)
            .build()
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        let result = self
            .client
            .create_schedule()
            .name(schedule_name(&message, at))
            .group_name(&self.group)
            .schedule_expression(at_expression(at))
            .schedule_expression_timezone("UTC")
            .flexible_time_window(window)
            .target(target)
            .action_after_completion(ActionAfterCompletion::Delete)
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_conflict_exception()) =>
            {
                Ok(())
            }
            Err(e) => Err(backend(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_expressions_round_up_to_the_second() {
        let t = DateTime::parse_from_rfc3339("2026-12-01T10:00:00.001Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(at_expression(t), "at(2026-12-01T10:00:01)");
        let t = DateTime::parse_from_rfc3339("2026-12-01T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(at_expression(t), "at(2026-12-01T10:00:00)");
    }
}
