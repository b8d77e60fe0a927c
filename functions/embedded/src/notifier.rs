//! The embedded notifier. On-call alerts go to the operator's alert webhook as a
//! signed JSON POST (Standard Webhooks headers, the operator's secret) when one is
//! configured; owner notices, and alerts without a webhook, go to the log at `warn`,
//! where the operator's log shipping picks them up.

use std::time::Duration;

use async_trait::async_trait;
use entrega_core::ports::{Audience, Notice, Notifier, StoreError, StoreResult};
use entrega_core::signature::{signature_header, Secret};

/// Per-POST timeout of the alert webhook.
const ALERT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where on-call alerts go. (`Debug` shows no secret: `Secret` redacts itself.)
#[derive(Clone, Debug)]
pub struct AlertWebhook {
    pub url: String,
    pub secret: Secret,
}

pub struct EmbeddedNotifier {
    webhook: Option<AlertWebhook>,
    http: reqwest::Client,
}

impl EmbeddedNotifier {
    pub fn new(webhook: Option<AlertWebhook>) -> Self {
        let http = reqwest::Client::builder()
            .timeout(ALERT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("the HTTP client configuration is valid");
        Self { webhook, http }
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
            (Audience::Owner { email }, _) => {
                tracing::warn!(kind = %notice.kind, tenant_id = %notice.tenant_id, to = %email, details = %notice.details, "OWNER NOTICE: {}", notice.summary);
                Ok(())
            }
        }
    }
}
