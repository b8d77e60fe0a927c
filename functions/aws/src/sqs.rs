//! SQS as the delivery and failures queues.

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::types::{MessageSystemAttributeName, SendMessageBatchRequestEntry};
use aws_sdk_sqs::Client;
use entrega_core::ports::{
    DelayLimits, MessageQueue, OutgoingMessage, ReceivedMessage, StoreError, StoreResult,
};

use crate::dynamo::backend;

/// SQS sends at most 10 messages per batch call.
pub const SEND_BATCH: usize = 10;
/// SQS's longest send delay.
pub const MAX_SEND_DELAY: Duration = Duration::from_secs(900);
/// The longest retry wait spent as a hidden (in-flight) message. Short: with the
/// `standard` schedule a dead endpoint receiving 100 events/s then holds about 9 000
/// messages in flight (30 s + 1 min each), far below SQS's ~120 000 (README, "Retries
/// and the in-flight limit"); longer waits are delayed sends or schedules.
pub const MAX_HIDDEN_RETRY: Duration = Duration::from_secs(60);
/// SQS caps visibility at 12 h after a message's receipt; keep a margin for the
/// attempt that ran before the change (at most the 30 s timeout plus writes).
pub const MAX_VISIBILITY_DELAY: Duration = Duration::from_secs(12 * 3600 - 300);

/// Whole seconds for SQS, rounded *up*: a retry that is 0.4 s early must be hidden
/// for 1 s, not 0 (hidden for 0 s it comes straight back, early again, and spins
/// through its receive count into the dead-letter queue).
pub fn seconds_up(delay: Duration) -> i32 {
    let secs = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
    i32::try_from(secs).unwrap_or(i32::MAX)
}

/// The visibility timeout for a message kept for later: at least 1 s, at most SQS's
/// limit (with its margin).
pub fn visibility_seconds(delay: Duration) -> i32 {
    seconds_up(delay.min(MAX_VISIBILITY_DELAY)).max(1)
}

#[derive(Clone)]
pub struct SqsQueue {
    client: Client,
    url: String,
}

impl SqsQueue {
    pub fn new(client: Client, url: impl Into<String>) -> Self {
        Self {
            client,
            url: url.into(),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }
}

#[async_trait]
impl MessageQueue for SqsQueue {
    async fn send(&self, messages: Vec<OutgoingMessage>) -> StoreResult<()> {
        for chunk in messages.chunks(SEND_BATCH) {
            let mut request = self.client.send_message_batch().queue_url(&self.url);
            for (i, m) in chunk.iter().enumerate() {
                if m.delay > MAX_SEND_DELAY {
                    return Err(StoreError::Backend(format!(
                        "SQS cannot delay a message by {:?}; longer waits go through the scheduler",
                        m.delay
                    )));
                }
                // MessageGroupId on a standard queue opts into SQS fair queues: one
                // tenant's backlog does not delay the others' messages.
                let entry = SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(&m.body)
                    .message_group_id(&m.group)
                    .delay_seconds(seconds_up(m.delay))
                    .build()
                    .map_err(|e| StoreError::Backend(e.to_string()))?;
                request = request.entries(entry);
            }
            let out = request.send().await.map_err(backend)?;
            if let Some(failed) = out.failed().first() {
                return Err(StoreError::Backend(format!(
                    "SQS refused a message: {} {}",
                    failed.code(),
                    failed.message().unwrap_or_default()
                )));
            }
        }
        Ok(())
    }

    async fn receive(&self, max: usize, visibility: Duration) -> StoreResult<Vec<ReceivedMessage>> {
        let out = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(max.clamp(1, 10) as i32)
            .visibility_timeout(visibility.as_secs() as i32)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .wait_time_seconds(1)
            .send()
            .await
            .map_err(backend)?;
        Ok(out
            .messages()
            .iter()
            .filter_map(|m| {
                let receive_count = m
                    .attributes()
                    .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(1);
                Some(ReceivedMessage {
                    receipt: m.receipt_handle()?.to_owned(),
                    body: m.body()?.to_owned(),
                    receive_count,
                })
            })
            .collect())
    }

    async fn change_visibility(&self, receipt: &str, delay: Duration) -> StoreResult<()> {
        self.client
            .change_message_visibility()
            .queue_url(&self.url)
            .receipt_handle(receipt)
            .visibility_timeout(visibility_seconds(delay))
            .send()
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn delete(&self, receipt: &str) -> StoreResult<()> {
        self.client
            .delete_message()
            .queue_url(&self.url)
            .receipt_handle(receipt)
            .send()
            .await
            .map_err(backend)?;
        Ok(())
    }

    fn delay_limits(&self) -> DelayLimits {
        Self::limits()
    }
}

impl SqsQueue {
    fn limits() -> DelayLimits {
        DelayLimits {
            hide: Some(MAX_HIDDEN_RETRY),
            send: Some(MAX_SEND_DELAY),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SQS refuses receives past about 120 000 messages in flight (standard queue).
    const SQS_IN_FLIGHT_LIMIT: f64 = 120_000.0;
    /// The alarm threshold (template.yaml, `delivery-in-flight`).
    const IN_FLIGHT_ALARM: f64 = 80_000.0;

    #[test]
    fn a_dead_endpoint_at_100_events_a_second_stays_far_below_the_in_flight_limit() {
        let limits = SqsQueue::limits();
        // The longest schedules, each retry at its upper jitter bound.
        for preset in ["standard", "persistent"] {
            let policy: entrega_core::retry::RetrySpec =
                serde_json::from_value(serde_json::json!(preset)).unwrap();
            let policy = policy.policy().unwrap();
            let delays: Vec<Duration> = policy
                .delays()
                .iter()
                .map(|d| d.mul_f64(1.0 + policy.jitter()))
                .collect();
            // Every attempt running its whole 30 s timeout, the worst case.
            let held = limits.in_flight(100.0, &delays, Duration::from_secs(30));
            assert!(held < IN_FLIGHT_ALARM, "{preset}: {held}");
            // Before: every wait up to 12 h was spent hidden.
            let before = DelayLimits {
                hide: Some(MAX_VISIBILITY_DELAY),
                send: None,
            };
            assert!(
                before.in_flight(100.0, &delays, Duration::from_secs(30)) > SQS_IN_FLIGHT_LIMIT,
                "{preset}: the calculation sees the old limit broken"
            );
        }
    }

    #[test]
    fn a_message_not_yet_due_is_never_hidden_for_zero_seconds() {
        assert_eq!(visibility_seconds(Duration::from_millis(400)), 1);
        assert_eq!(visibility_seconds(Duration::ZERO), 1);
        assert_eq!(visibility_seconds(Duration::from_millis(1_001)), 2);
        assert_eq!(visibility_seconds(Duration::from_secs(30)), 30);
        assert_eq!(
            visibility_seconds(Duration::from_secs(13 * 3600)),
            MAX_VISIBILITY_DELAY.as_secs() as i32
        );
        assert_eq!(
            seconds_up(Duration::ZERO),
            0,
            "a send with no delay stays immediate"
        );
        assert_eq!(seconds_up(Duration::from_millis(1)), 1);
    }
}
