//! The embedded notifier. On-call alerts go to the operator's alert webhook as a
//! signed JSON POST (Standard Webhooks headers, the operator's secret) when one is
//! configured; owner notices are e-mailed through the operator's SMTP server when one
//! is configured. Anything without a configured channel goes to the log at `warn`,
//! where the operator's log shipping picks it up.

use std::time::Duration;

use async_trait::async_trait;
use entrega_core::ports::{Audience, Notice, Notifier, StoreError, StoreResult};
use entrega_core::signature::{signature_header, Secret};
use lettre::message::header::ContentType;
use lettre::message::Mailbox;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

/// Per-POST timeout of the alert webhook.
const ALERT_TIMEOUT: Duration = Duration::from_secs(10);
/// Per-command timeout of the SMTP conversation.
const SMTP_TIMEOUT: Duration = Duration::from_secs(20);

/// Where on-call alerts go. (`Debug` shows no secret: `Secret` redacts itself.)
#[derive(Clone, Debug)]
pub struct AlertWebhook {
    pub url: String,
    pub secret: Secret,
}

/// Where owner notices are e-mailed through.
#[derive(Clone, Debug)]
pub struct SmtpRelay {
    /// `smtp://user:pass@host:587?tls=required`, or `smtps://…` (lettre's URL form).
    pub url: String,
    pub from: Mailbox,
}

pub struct EmbeddedNotifier {
    webhook: Option<AlertWebhook>,
    http: reqwest::Client,
    smtp: Option<(AsyncSmtpTransport<Tokio1Executor>, Mailbox)>,
}

impl EmbeddedNotifier {
    pub fn new(webhook: Option<AlertWebhook>, smtp: Option<SmtpRelay>) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .timeout(ALERT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("the HTTP client configuration is valid");
        let smtp = match smtp {
            Some(relay) => {
                let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(&relay.url)
                    .map_err(|e| format!("ENTREGA_SMTP_URL: {e}"))?
                    .timeout(Some(SMTP_TIMEOUT))
                    .build();
                Some((transport, relay.from))
            }
            None => None,
        };
        Ok(Self {
            webhook,
            http,
            smtp,
        })
    }

    async fn email(&self, to: &str, notice: &Notice) -> StoreResult<()> {
        let Some((transport, from)) = &self.smtp else {
            tracing::warn!(kind = %notice.kind, tenant_id = %notice.tenant_id, to = %to, details = %notice.details, "OWNER NOTICE: {}", notice.summary);
            return Ok(());
        };
        let to: Mailbox = to
            .parse()
            .map_err(|e| StoreError::Backend(format!("owner address {to}: {e}")))?;
        let text = format!(
            "{}\n\n{}\n",
            notice.summary,
            serde_json::to_string_pretty(&notice.details).unwrap_or_default()
        );
        let message = Message::builder()
            .from(from.clone())
            .to(to)
            .subject(format!("[Entrega] {}", notice.summary))
            .header(ContentType::TEXT_PLAIN)
            .body(text)
            .map_err(|e| StoreError::Backend(format!("owner notice: {e}")))?;
        transport
            .send(message)
            .await
            .map_err(|e| StoreError::Backend(format!("smtp: {e}")))?;
        Ok(())
    }

    async fn post(&self, hook: &AlertWebhook, notice: &Notice) -> StoreResult<()> {
        let mut body = serde_json::json!({
            "kind": notice.kind,
            "tenant_id": notice.tenant_id,
            "summary": notice.summary,
        });
        if let (Some(body), Some(details)) = (body.as_object_mut(), notice.details.as_object()) {
            body.extend(details.clone());
        }
        let body = body.to_string();
        let id = format!(
            "alert_{}",
            entrega_core::ids::EventId::generate()
                .as_str()
                .trim_start_matches("evt_")
        );
        let ts = chrono::Utc::now().timestamp();
        let response = self
            .http
            .post(&hook.url)
            .header("content-type", "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", ts.to_string())
            .header(
                "webhook-signature",
                signature_header([&hook.secret], &id, ts, body.as_bytes()),
            )
            .body(body)
            .send()
            .await
            .map_err(|e| StoreError::Backend(format!("alert webhook: {e}")))?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(StoreError::Backend(format!(
                "alert webhook answered {}",
                response.status()
            )))
        }
    }
}

#[async_trait]
impl Notifier for EmbeddedNotifier {
    async fn notify(&self, notice: &Notice) -> StoreResult<()> {
        match (&notice.audience, &self.webhook) {
            (Audience::OnCall, Some(hook)) => self.post(hook, notice).await,
            (Audience::OnCall, None) => {
                tracing::warn!(kind = %notice.kind, tenant_id = %notice.tenant_id, details = %notice.details, "ALERT: {}", notice.summary);
                Ok(())
            }
            (Audience::Owner { email }, _) => self.email(email, notice).await,
        }
    }
}
