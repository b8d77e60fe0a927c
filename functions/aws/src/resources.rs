//! The AWS resources Entrega runs on, and the `Services` built over them.
//!
//! Lambda functions get each name from the environment (the template sets them);
//! `entrega serve --backend aws` and `entrega provision` derive them from a prefix.

use std::sync::Arc;

use entrega_core::ports::{Clock, Services, Transport};

use crate::dynamo::DynamoStore;
use crate::scheduler::EventBridgeScheduler;
use crate::sns::AwsNotifier;
use crate::sqs::SqsQueue;

/// Days deliveries, attempts and failures are kept when nothing says otherwise.
pub const DEFAULT_RETENTION_DAYS: i64 = 30;

/// Names and addresses of every resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsResources {
    pub main_table: String,
    pub outbox_table: String,
    pub delivery_queue_url: String,
    pub delivery_queue_arn: String,
    /// Where a scheduled retry goes when the scheduler cannot deliver it to the queue.
    pub delivery_dlq_arn: String,
    pub failure_queue_url: String,
    /// Where the outbox trigger's failures go: stream batches it gave up on (Lambda's
    /// on-failure destination) and items that can never be events (quarantined).
    pub outbox_dlq_url: String,
    pub schedule_group: String,
    pub scheduler_role_arn: String,
    /// Where per-tenant alerts go (the paging topic takes the CloudWatch alarms).
    pub notification_topic_arn: String,
    /// The SES-verified sender of owner notices.
    pub notice_from: String,
    pub retention_days: i64,
}

/// The names a prefix gives (tables, queues, group, topic).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceNames {
    pub main_table: String,
    pub outbox_table: String,
    pub delivery_queue: String,
    pub delivery_dlq: String,
    pub failure_queue: String,
    pub failure_dlq: String,
    /// Where the outbox trigger's event source mapping sends records it gave up on.
    pub outbox_dlq: String,
    pub schedule_group: String,
    pub alert_topic: String,
    pub notification_topic: String,
    pub scheduler_role: String,
    /// Who owner notices are from (`ENTREGA_NOTICE_FROM` overrides; SES must have it
    /// verified).
    pub notice_from: String,
}

impl ResourceNames {
    pub fn with_prefix(prefix: &str) -> Self {
        Self {
            main_table: format!("{prefix}-main"),
            outbox_table: format!("{prefix}-outbox"),
            delivery_queue: format!("{prefix}-deliveries"),
            delivery_dlq: format!("{prefix}-deliveries-dlq"),
            failure_queue: format!("{prefix}-failures"),
            failure_dlq: format!("{prefix}-failures-dlq"),
            outbox_dlq: format!("{prefix}-outbox-dlq"),
            schedule_group: prefix.to_owned(),
            alert_topic: format!("{prefix}-alerts"),
            notification_topic: format!("{prefix}-notifications"),
            scheduler_role: format!("{prefix}-scheduler"),
            notice_from: std::env::var("ENTREGA_NOTICE_FROM")
                .unwrap_or_else(|_| format!("{prefix}-notices@example.com")),
        }
    }
}

impl AwsResources {
    /// From the Lambda environment (names the template passes in).
    pub fn from_env() -> Result<Self, String> {
        let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
        Ok(Self {
            main_table: var("ENTREGA_MAIN_TABLE")?,
            outbox_table: var("ENTREGA_OUTBOX_TABLE")?,
            delivery_queue_url: var("ENTREGA_DELIVERY_QUEUE_URL")?,
            delivery_queue_arn: var("ENTREGA_DELIVERY_QUEUE_ARN")?,
            delivery_dlq_arn: var("ENTREGA_DELIVERY_DLQ_ARN")?,
            failure_queue_url: var("ENTREGA_FAILURE_QUEUE_URL")?,
            outbox_dlq_url: var("ENTREGA_OUTBOX_DLQ_URL")?,
            schedule_group: var("ENTREGA_SCHEDULE_GROUP")?,
            scheduler_role_arn: var("ENTREGA_SCHEDULER_ROLE_ARN")?,
            notification_topic_arn: var("ENTREGA_NOTIFICATION_TOPIC_ARN")?,
            notice_from: var("ENTREGA_NOTICE_FROM")?,
            retention_days: std::env::var("ENTREGA_RETENTION_DAYS")
                .ok()
                .and_then(|d| d.parse().ok())
                .unwrap_or(DEFAULT_RETENTION_DAYS),
        })
    }

    /// Look the prefix's resources up (they must exist: see `provision`).
    pub async fn discover(sdk: &aws_config::SdkConfig, prefix: &str) -> Result<Self, String> {
        let names = ResourceNames::with_prefix(prefix);
        let sqs = aws_sdk_sqs::Client::new(sdk);
        let url_of = |queue: String| {
            let sqs = sqs.clone();
            async move {
                sqs.get_queue_url()
                    .queue_name(&queue)
                    .send()
                    .await
                    .map_err(|e| {
                        format!(
                            "queue {queue} not found (run `entrega provision --backend aws`): {e}"
                        )
                    })?
                    .queue_url()
                    .map(str::to_owned)
                    .ok_or_else(|| format!("queue {queue} has no URL"))
            }
        };
        let delivery_queue_url = url_of(names.delivery_queue.clone()).await?;
        let failure_queue_url = url_of(names.failure_queue.clone()).await?;
        let outbox_dlq_url = url_of(names.outbox_dlq.clone()).await?;
        let delivery_queue_arn = queue_arn(&sqs, &delivery_queue_url).await?;
        let delivery_dlq_arn = queue_arn(&sqs, &url_of(names.delivery_dlq.clone()).await?).await?;
        let account_region = delivery_queue_arn
            .strip_prefix("arn:aws:sqs:")
            .and_then(|rest| rest.rsplit_once(':'))
            .map(|(region_account, _)| region_account.to_owned())
            .ok_or("unexpected queue ARN")?;
        let (region, account) = account_region
            .split_once(':')
            .ok_or("unexpected queue ARN")?;
        Ok(Self {
            main_table: names.main_table,
            outbox_table: names.outbox_table,
            delivery_queue_url,
            delivery_queue_arn,
            delivery_dlq_arn,
            failure_queue_url,
            outbox_dlq_url,
            schedule_group: names.schedule_group,
            scheduler_role_arn: format!("arn:aws:iam::{account}:role/{}", names.scheduler_role),
            notification_topic_arn: format!(
                "arn:aws:sns:{region}:{account}:{}",
                names.notification_topic
            ),
            notice_from: names.notice_from,
            retention_days: DEFAULT_RETENTION_DAYS,
        })
    }
}

/// A queue's ARN, from its URL.
pub async fn queue_arn(sqs: &aws_sdk_sqs::Client, url: &str) -> Result<String, String> {
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| format!("queue attributes of {url}: {e}"))?;
    out.attributes()
        .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::QueueArn))
        .cloned()
        .ok_or_else(|| format!("queue {url} has no ARN"))
}

/// Every AWS client the runtime uses, built once from one SDK configuration. The
/// interceptors (none in production) see every call: the cost benchmark counts them.
#[derive(Clone, Debug)]
pub struct AwsClients {
    pub dynamo: aws_sdk_dynamodb::Client,
    pub streams: aws_sdk_dynamodbstreams::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub scheduler: aws_sdk_scheduler::Client,
    pub sns: aws_sdk_sns::Client,
    pub ses: aws_sdk_sesv2::Client,
}

impl AwsClients {
    pub fn new(sdk: &aws_config::SdkConfig) -> Self {
        Self::with_interceptors(sdk, &[])
    }

    pub fn with_interceptors(
        sdk: &aws_config::SdkConfig,
        interceptors: &[aws_sdk_dynamodb::config::SharedInterceptor],
    ) -> Self {
        macro_rules! client {
            ($sdk_crate:ident) => {{
                let mut config = $sdk_crate::config::Builder::from(sdk);
                for i in interceptors {
                    config.push_interceptor(i.clone());
                }
                $sdk_crate::Client::from_conf(config.build())
            }};
        }
        Self {
            dynamo: client!(aws_sdk_dynamodb),
            streams: client!(aws_sdk_dynamodbstreams),
            sqs: client!(aws_sdk_sqs),
            scheduler: client!(aws_sdk_scheduler),
            sns: client!(aws_sdk_sns),
            ses: client!(aws_sdk_sesv2),
        }
    }
}

/// The store over the resources' tables (the API needs only this and the queues).
pub fn dynamo_store(
    sdk: &aws_config::SdkConfig,
    r: &AwsResources,
    clock: Arc<dyn Clock>,
) -> DynamoStore {
    store_on(&aws_sdk_dynamodb::Client::new(sdk), r, clock)
}

fn store_on(
    client: &aws_sdk_dynamodb::Client,
    r: &AwsResources,
    clock: Arc<dyn Clock>,
) -> DynamoStore {
    DynamoStore::new(
        client.clone(),
        r.main_table.clone(),
        r.outbox_table.clone(),
        clock,
        r.retention_days,
    )
}

/// Every port over AWS services.
pub fn aws_services(
    sdk: &aws_config::SdkConfig,
    r: &AwsResources,
    transport: Arc<dyn Transport>,
    clock: Arc<dyn Clock>,
) -> Services {
    services_on(&AwsClients::new(sdk), r, transport, clock)
}

/// Every port over the given clients.
pub fn services_on(
    clients: &AwsClients,
    r: &AwsResources,
    transport: Arc<dyn Transport>,
    clock: Arc<dyn Clock>,
) -> Services {
    let store = Arc::new(store_on(&clients.dynamo, r, clock.clone()));
    Services {
        store: store.clone(),
        backlog: store.clone(),
        random: Arc::new(entrega_core::ports::SystemRandom),
        slots: Arc::new(entrega_core::slots::LocalFirstSlots::new(store_on(
            &clients.dynamo,
            r,
            clock.clone(),
        ))),
        deliveries: Arc::new(SqsQueue::new(
            clients.sqs.clone(),
            r.delivery_queue_url.clone(),
        )),
        failures: Arc::new(SqsQueue::new(
            clients.sqs.clone(),
            r.failure_queue_url.clone(),
        )),
        scheduler: Arc::new(EventBridgeScheduler::new(
            clients.scheduler.clone(),
            r.schedule_group.clone(),
            r.scheduler_role_arn.clone(),
            r.delivery_queue_arn.clone(),
            r.delivery_dlq_arn.clone(),
        )),
        notifier: Arc::new(AwsNotifier::new(
            clients.sns.clone(),
            r.notification_topic_arn.clone(),
            clients.ses.clone(),
            r.notice_from.clone(),
        )),
        transport,
        clock,
        metrics: Arc::new(crate::emf::EmfMetrics),
        settings: entrega_core::ports::Settings::default(),
    }
}

/// One attempt of an AWS call may take this long before it is retried: without it, a
/// call that hangs would stall a poller for good.
pub const SDK_ATTEMPT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);
/// A whole AWS call, retries included.
pub const SDK_OPERATION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// Connecting to an AWS endpoint.
pub const SDK_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The timeouts every SDK client here uses.
pub fn sdk_timeouts() -> aws_config::timeout::TimeoutConfig {
    aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(SDK_CONNECT_TIMEOUT)
        .operation_attempt_timeout(SDK_ATTEMPT_TIMEOUT)
        .operation_timeout(SDK_OPERATION_TIMEOUT)
        .build()
}

/// The SDK configuration from the environment (`AWS_ENDPOINT_URL` is honoured).
pub async fn sdk_config() -> aws_config::SdkConfig {
    sdk_defaults().load().await
}

/// What every SDK configuration starts from: the timeouts, and the one HTTPS client.
pub fn sdk_defaults() -> aws_config::ConfigLoader {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .timeout_config(sdk_timeouts())
        .http_client(https_client())
}

/// The SDK's HTTPS client: rustls with ring, the TLS stack reqwest already links (the
/// SDK crates are built without a client of their own).
fn https_client() -> aws_smithy_runtime_api::client::http::SharedHttpClient {
    use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

/// A Lambda function's SDK configuration. Lambda hands every function its region and
/// its role's credentials in the environment, so the default chain (profiles, SSO,
/// web identity through STS, IMDS, containers) is never used there; built without it,
/// its code (an STS client among it) stays out of the bootstraps.
pub fn lambda_sdk_config() -> Result<aws_config::SdkConfig, String> {
    lambda_sdk_config_from(|name| std::env::var(name).ok())
}

/// [`lambda_sdk_config`] from the variables `var` gives.
pub fn lambda_sdk_config_from(
    var: impl Fn(&str) -> Option<String>,
) -> Result<aws_config::SdkConfig, String> {
    let required = |name: &str| var(name).ok_or_else(|| format!("{name} is not set"));
    let credentials = aws_credential_types::Credentials::new(
        required("AWS_ACCESS_KEY_ID")?,
        required("AWS_SECRET_ACCESS_KEY")?,
        var("AWS_SESSION_TOKEN"),
        None,
        "lambda-environment",
    );
    let sleep = aws_smithy_async::rt::sleep::default_async_sleep()
        .ok_or("no async sleep (the SDK needs tokio's)")?;
    let mut config = aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(required("AWS_REGION")?))
        .credentials_provider(
            aws_credential_types::provider::SharedCredentialsProvider::new(credentials),
        )
        .http_client(https_client())
        .timeout_config(sdk_timeouts())
        .retry_config(aws_config::retry::RetryConfig::standard())
        .sleep_impl(sleep)
        .time_source(aws_smithy_async::time::SharedTimeSource::default());
    if let Some(url) = var("AWS_ENDPOINT_URL") {
        config = config.endpoint_url(url);
    }
    Ok(config.build())
}
