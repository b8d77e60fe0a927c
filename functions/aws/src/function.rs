//! What every Lambda function does at cold start: JSON logs for CloudWatch, and the
//! ports over the resources the template names in the environment.

use std::sync::Arc;

use entrega_core::ports::{Services, Settings, SystemClock, Transport};

use crate::resources::{aws_services, sdk_config, AwsResources};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// JSON lines on stdout (CloudWatch Logs), filtered by `RUST_LOG` (default `info`).
pub fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_current_span(true)
        .without_time() // CloudWatch stamps each line
        .init();
}

/// Logs initialised and the services built from the environment.
pub async fn cold_start(transport: Arc<dyn Transport>) -> Result<Services, BoxError> {
    init_logs();
    let resources = AwsResources::from_env()?;
    let sdk = sdk_config().await;
    let mut services = aws_services(&sdk, &resources, transport, Arc::new(SystemClock));
    services.settings = settings_from_env();
    Ok(services)
}

/// The operator's settings from the environment (the template's parameters).
pub fn settings_from_env() -> Settings {
    let number = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let defaults = Settings::default();
    Settings {
        alert_threshold: number("ENTREGA_ALERT_THRESHOLD").unwrap_or(defaults.alert_threshold),
        unhealthy_after: number("ENTREGA_UNHEALTHY_AFTER_DAYS")
            .map(|d| std::time::Duration::from_secs(d * 86_400))
            .unwrap_or(defaults.unhealthy_after),
        ..defaults
    }
}

/// The outbox trigger's quarantine: its DLQ, from the environment.
pub async fn outbox_quarantine() -> Result<crate::sqs::SqsQueue, BoxError> {
    let resources = AwsResources::from_env()?;
    Ok(crate::sqs::SqsQueue::new(
        aws_sdk_sqs::Client::new(&sdk_config().await),
        resources.outbox_dlq_url,
    ))
}
