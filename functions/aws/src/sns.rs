//! SNS as the notifier: on-call's alerts go to a topic (pager, e-mail, chat).

use async_trait::async_trait;
use aws_sdk_sns::Client;
use entrega_core::delivery::truncate_utf8;
use entrega_core::ports::{Notice, Notifier, StoreResult};

use crate::dynamo::backend;

/// SNS subjects are at most 100 characters.
const MAX_SUBJECT: usize = 100;

#[derive(Clone)]
pub struct SnsNotifier {
    client: Client,
    topic_arn: String,
}

impl SnsNotifier {
    pub fn new(client: Client, topic_arn: impl Into<String>) -> Self {
        Self {
            client,
            topic_arn: topic_arn.into(),
        }
    }
}

#[async_trait]
impl Notifier for SnsNotifier {
    async fn notify(&self, notice: &Notice) -> StoreResult<()> {
        // Subjects must be ASCII without line breaks.
        let subject: String = format!("Entrega {}: {}", notice.kind, notice.tenant_id)
            .chars()
            .map(|c| {
                if c.is_ascii() && !c.is_control() {
                    c
                } else {
                    ' '
                }
            })
            .collect();
        self.client
            .publish()
            .topic_arn(&self.topic_arn)
            .subject(truncate_utf8(&subject, MAX_SUBJECT))
            .message(serde_json::to_string(notice).expect("a notice serialises"))
            .send()
            .await
            .map_err(backend)?;
        Ok(())
    }
}
