//! Telling humans on AWS: on-call alerts go to the SNS topic (pager, e-mail, chat
//! subscriptions); notices for a tenant's owner are e-mailed with SES.

use async_trait::async_trait;
use aws_sdk_sesv2::types::{Body, Content, Destination, EmailContent, Message};
use entrega_core::delivery::truncate_utf8;
use entrega_core::ports::{Audience, Notice, Notifier, StoreError, StoreResult};

use crate::dynamo::backend;

/// SNS subjects are at most 100 characters.
const MAX_SUBJECT: usize = 100;

#[derive(Clone)]
pub struct AwsNotifier {
    sns: aws_sdk_sns::Client,
    topic_arn: String,
    ses: aws_sdk_sesv2::Client,
    /// The SES-verified address owner notices come from.
    from: String,
}

impl AwsNotifier {
    pub fn new(
        sns: aws_sdk_sns::Client,
        topic_arn: String,
        ses: aws_sdk_sesv2::Client,
        from: String,
    ) -> Self {
        Self {
            sns,
            topic_arn,
            ses,
            from,
        }
    }

    async fn page(&self, notice: &Notice) -> StoreResult<()> {
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
        self.sns
            .publish()
            .topic_arn(&self.topic_arn)
            .subject(truncate_utf8(&subject, MAX_SUBJECT))
            .message(serde_json::to_string(notice).expect("a notice serialises"))
            .send()
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn email(&self, to: &str, notice: &Notice) -> StoreResult<()> {
        let text = format!(
            "{}\n\n{}\n",
            notice.summary,
            serde_json::to_string_pretty(&notice.details).unwrap_or_default()
        );
        let content = |data: &str| {
            Content::builder()
                .data(data)
                .charset("UTF-8")
                .build()
                .map_err(|e| StoreError::Backend(e.to_string()))
        };
        let message = Message::builder()
            .subject(content(&format!("[Entrega] {}", notice.summary))?)
            .body(Body::builder().text(content(&text)?).build())
            .build();
        self.ses
            .send_email()
            .from_email_address(&self.from)
            .destination(Destination::builder().to_addresses(to).build())
            .content(EmailContent::builder().simple(message).build())
            .send()
            .await
            .map_err(backend)?;
        Ok(())
    }
}

#[async_trait]
impl Notifier for AwsNotifier {
    async fn notify(&self, notice: &Notice) -> StoreResult<()> {
        match &notice.audience {
            Audience::OnCall => self.page(notice).await,
            Audience::Owner { email } => self.email(email, notice).await,
        }
    }
}
