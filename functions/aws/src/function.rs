//! What every Lambda function does at cold start: JSON logs for CloudWatch, and the
//! ports over the resources the template names in the environment.

use std::sync::Arc;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use entrega_core::ports::{Services, Settings, SystemClock, Transport};

use crate::resources::{lambda_sdk_config, services_on, AwsClients, AwsResources};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// JSON lines on stdout (CloudWatch Logs), filtered by `RUST_LOG` (default `info`):
/// levels per target (`info,entrega_core=debug`). Not the full `EnvFilter` syntax,
/// whose span and field matching brings a regex engine into every bootstrap.
pub fn init_logs() {
    let info = || {
        tracing_subscriber::filter::Targets::new()
            .with_default(tracing_subscriber::filter::LevelFilter::INFO)
    };
    // A RUST_LOG that cannot be read is said out loud (once the log is up), not
    // silently replaced by `info`.
    let (filter, refused) = match std::env::var("RUST_LOG") {
        Err(_) => (info(), None),
        Ok(directives) => match directives.parse() {
            Ok(filter) => (filter, None),
            Err(e) => (info(), Some((directives, format!("{e}")))),
        },
    };
    let lines = tracing_subscriber::fmt::layer()
        .json()
        .with_current_span(true)
        .without_time(); // CloudWatch stamps each line
    tracing_subscriber::registry()
        .with(lines)
        .with(filter)
        .init();
    if let Some((directives, error)) = refused {
        tracing::warn!(rust_log = %directives, %error, "RUST_LOG could not be read; logging at info");
    }
}

/// Logs initialised and the services built from the environment.
pub async fn cold_start(transport: Arc<dyn Transport>) -> Result<Services, BoxError> {
    Ok(start(transport).await?.0)
}

/// The outbox trigger's cold start: its services, and its quarantine (the outbox DLQ)
/// on the same SQS client, from the same one reading of the environment.
pub async fn outbox_trigger_start(
    transport: Arc<dyn Transport>,
) -> Result<(Services, crate::sqs::SqsQueue), BoxError> {
    let (services, clients, resources) = start(transport).await?;
    let quarantine = crate::sqs::SqsQueue::new(clients.sqs, resources.outbox_dlq_url);
    Ok((services, quarantine))
}

/// What every function builds once: logs, the SDK configuration, the clients.
async fn start(
    transport: Arc<dyn Transport>,
) -> Result<(Services, AwsClients, AwsResources), BoxError> {
    init_logs();
    let resources = AwsResources::from_env()?;
    let clients = AwsClients::new(&lambda_sdk_config()?);
    let mut services = services_on(&clients, &resources, transport, Arc::new(SystemClock));
    services.settings = settings_from_env();
    Ok((services, clients, resources))
}

/// The share of the worker's concurrency that attempts at endpoints slow lately hold
/// at most, together ([`Settings::slow_endpoint_share`]): half, so that the other half
/// is always there for endpoints that answer, however many others hang.
pub const SLOW_ENDPOINT_SHARE_PERCENT: u32 = 50;
/// The share of the worker's concurrency that attempts at any one endpoint hold at
/// most ([`Settings::one_endpoint_share`]): a quarter, so that an endpoint that starts
/// hanging, before it is known slow, and the slow endpoints' half together still leave
/// a quarter of the invocations to endpoints that answer.
pub const ONE_ENDPOINT_SHARE_PERCENT: u32 = 25;
/// The template's default `WorkerConcurrency`, for an environment that names none.
pub const DEFAULT_WORKER_CONCURRENCY: u32 = 100;

/// The slow endpoints' share of a worker running `worker_concurrency` invocations.
pub const fn slow_endpoint_share(worker_concurrency: u32) -> u32 {
    share_of(worker_concurrency, SLOW_ENDPOINT_SHARE_PERCENT)
}

/// One endpoint's share of a worker running `worker_concurrency` invocations.
pub const fn one_endpoint_share(worker_concurrency: u32) -> u32 {
    share_of(worker_concurrency, ONE_ENDPOINT_SHARE_PERCENT)
}

/// `percent` of `worker_concurrency`, at least one (a share of none would stop every
/// attempt it applies to).
const fn share_of(worker_concurrency: u32, percent: u32) -> u32 {
    let share = worker_concurrency.saturating_mul(percent) / 100;
    if share == 0 {
        1
    } else {
        share
    }
}

/// The operator's settings from the environment (the template's parameters).
pub fn settings_from_env() -> Settings {
    let number = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let defaults = Settings::default();
    let worker_concurrency = number("ENTREGA_WORKER_CONCURRENCY")
        .and_then(|c| u32::try_from(c).ok())
        .unwrap_or(DEFAULT_WORKER_CONCURRENCY);
    Settings {
        alert_threshold: number("ENTREGA_ALERT_THRESHOLD").unwrap_or(defaults.alert_threshold),
        unhealthy_after: number("ENTREGA_UNHEALTHY_AFTER_DAYS")
            .map(|d| std::time::Duration::from_secs(d * 86_400))
            .unwrap_or(defaults.unhealthy_after),
        slow_endpoint_share: slow_endpoint_share(worker_concurrency),
        one_endpoint_share: one_endpoint_share(worker_concurrency),
        ..defaults
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slow_share_is_half_the_worker_and_never_none() {
        assert_eq!(slow_endpoint_share(DEFAULT_WORKER_CONCURRENCY), 50);
        assert_eq!(slow_endpoint_share(1_000), 500);
        // The template's least concurrency (2) still lets a slow endpoint be tried.
        assert_eq!(slow_endpoint_share(2), 1);
        assert_eq!(slow_endpoint_share(1), 1);
        assert_eq!(slow_endpoint_share(u32::MAX), u32::MAX / 100);
    }

    #[test]
    fn one_endpoints_share_is_a_quarter_of_the_worker_and_never_none() {
        assert_eq!(one_endpoint_share(DEFAULT_WORKER_CONCURRENCY), 25);
        assert_eq!(one_endpoint_share(16), 4);
        assert_eq!(one_endpoint_share(3), 1);
        // With the slow half taken and one endpoint starting to hang, some are left.
        for worker in [4, 16, 100, 1_000] {
            let held = slow_endpoint_share(worker) + one_endpoint_share(worker);
            assert!(held < worker, "{worker}: {held} held");
        }
    }
}
