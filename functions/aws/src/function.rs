//! What every Lambda function does at cold start: JSON logs for CloudWatch, and the
//! ports over the resources the template names in the environment.

use std::sync::Arc;

use entrega_core::ports::{Services, SystemClock, Transport};

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
    Ok(aws_services(
        &sdk,
        &resources,
        transport,
        Arc::new(SystemClock),
    ))
}

/// The alert threshold the dlq-analyzer is configured with.
pub fn alert_threshold() -> u64 {
    std::env::var("ENTREGA_ALERT_THRESHOLD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(entrega_core::handlers::failures::DEFAULT_ALERT_THRESHOLD)
}
