//! `entrega provision --backend aws`: create the tables, queues, scheduler group and
//! alert topic idempotently (for an emulator or a test account; production deploys
//! with `template.yaml`). [`spec`] is the single description both follow: a test
//! checks the template declares exactly these.

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ScalarAttributeType, StreamSpecification, StreamViewType, TimeToLiveSpecification,
};
use aws_sdk_sqs::types::QueueAttributeName;

use crate::dynamo::{GSIS, PK, SK, TTL_ATTRIBUTE};
use crate::resources::{queue_arn, ResourceNames};

/// Timeout of the delivery-worker function: a batch of attempts of at most 30 s each,
/// run concurrently, plus writes.
pub const WORKER_TIMEOUT_S: u32 = 60;
/// Timeout of the dlq-analyzer function.
pub const ANALYZER_TIMEOUT_S: u32 = 30;
/// AWS's rule for queues that trigger Lambda: visibility ≥ 6 × function timeout.
const VISIBILITY_PER_TIMEOUT: u32 = 6;
/// Receives of one delivery message before SQS dead-letters it. Retries under the
/// longest policy are 21 receives; this is only a net for poison messages, never a
/// limit the retry policy can reach.
pub const DELIVERY_MAX_RECEIVES: u32 = 100;
/// Receives of one failure notice before it is dead-lettered.
pub const FAILURE_MAX_RECEIVES: u32 = 10;
/// Longest message retention SQS allows (14 days).
pub const RETENTION_S: u32 = 1_209_600;

/// A table as provisioned and as the template declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSpec {
    pub name: String,
    /// (attribute, hash or range)
    pub keys: Vec<(&'static str, &'static str)>,
    /// (index, partition attribute, sort attribute)
    pub gsis: Vec<(&'static str, &'static str, &'static str)>,
    pub stream: Option<&'static str>,
    pub ttl_attribute: &'static str,
}

/// A queue as provisioned and as the template declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSpec {
    pub name: String,
    pub visibility_timeout_s: u32,
    pub retention_s: u32,
    /// (dead-letter queue name, maxReceiveCount)
    pub redrive: Option<(String, u32)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub tables: Vec<TableSpec>,
    pub queues: Vec<QueueSpec>,
    pub schedule_group: String,
    /// Paging: CloudWatch alarms (infrastructure).
    pub alert_topic: String,
    /// Notification: per-tenant alerts (failure threshold, unacknowledged failures).
    pub notification_topic: String,
}

pub fn spec(names: &ResourceNames) -> Spec {
    let dlq = |name: &str| QueueSpec {
        name: name.to_owned(),
        visibility_timeout_s: 30,
        retention_s: RETENTION_S,
        redrive: None,
    };
    Spec {
        tables: vec![
            TableSpec {
                name: names.main_table.clone(),
                keys: vec![(PK, "HASH"), (SK, "RANGE")],
                gsis: GSIS.to_vec(),
                stream: None,
                ttl_attribute: TTL_ATTRIBUTE,
            },
            TableSpec {
                name: names.outbox_table.clone(),
                keys: vec![(PK, "HASH")],
                gsis: vec![],
                stream: Some("NEW_IMAGE"),
                ttl_attribute: TTL_ATTRIBUTE,
            },
        ],
        queues: vec![
            QueueSpec {
                name: names.delivery_queue.clone(),
                visibility_timeout_s: VISIBILITY_PER_TIMEOUT * WORKER_TIMEOUT_S,
                retention_s: RETENTION_S,
                redrive: Some((names.delivery_dlq.clone(), DELIVERY_MAX_RECEIVES)),
            },
            dlq(&names.delivery_dlq),
            QueueSpec {
                name: names.failure_queue.clone(),
                visibility_timeout_s: VISIBILITY_PER_TIMEOUT * ANALYZER_TIMEOUT_S,
                retention_s: RETENTION_S,
                redrive: Some((names.failure_dlq.clone(), FAILURE_MAX_RECEIVES)),
            },
            dlq(&names.failure_dlq),
            dlq(&names.outbox_dlq),
        ],
        schedule_group: names.schedule_group.clone(),
        alert_topic: names.alert_topic.clone(),
        notification_topic: names.notification_topic.clone(),
    }
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Create what `spec` describes; existing resources are left as they are.
pub async fn provision(sdk: &aws_config::SdkConfig, names: &ResourceNames) -> Result<Spec, String> {
    let spec = spec(names);
    let dynamo = aws_sdk_dynamodb::Client::new(sdk);
    for table in &spec.tables {
        create_table(&dynamo, table).await?;
    }
    let sqs = aws_sdk_sqs::Client::new(sdk);
    // Dead-letter queues first: the others' redrive policies name them.
    for queue in spec
        .queues
        .iter()
        .filter(|q| q.redrive.is_none())
        .chain(spec.queues.iter().filter(|q| q.redrive.is_some()))
    {
        create_queue(&sqs, queue).await?;
    }
    let scheduler = aws_sdk_scheduler::Client::new(sdk);
    match scheduler
        .create_schedule_group()
        .name(&spec.schedule_group)
        .send()
        .await
    {
        Ok(_) => {}
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_conflict_exception()) => {}
        Err(e) => {
            return Err(format!(
                "schedule group: {}",
                aws_sdk_scheduler::error::DisplayErrorContext(e)
            ))
        }
    }
    // The sender of owner notices (on AWS, SES then asks that address to confirm).
    let ses = aws_sdk_sesv2::Client::new(sdk);
    if ses
        .get_email_identity()
        .email_identity(&names.notice_from)
        .send()
        .await
        .is_err()
    {
        ses.create_email_identity()
            .email_identity(&names.notice_from)
            .send()
            .await
            .map_err(|e| {
                format!(
                    "sender identity: {}",
                    aws_sdk_sesv2::error::DisplayErrorContext(e)
                )
            })?;
    }
    for topic in [&spec.alert_topic, &spec.notification_topic] {
        aws_sdk_sns::Client::new(sdk)
            .create_topic()
            .name(topic)
            .send()
            .await
            .map_err(|e| format!("topic: {}", aws_sdk_sns::error::DisplayErrorContext(e)))?;
    }
    Ok(spec)
}

async fn create_table(dynamo: &aws_sdk_dynamodb::Client, t: &TableSpec) -> Result<(), String> {
    if dynamo
        .describe_table()
        .table_name(&t.name)
        .send()
        .await
        .is_ok()
    {
        return Ok(());
    }
    let mut attributes: Vec<&str> = t.keys.iter().map(|(a, _)| *a).collect();
    for (_, pk, sk) in &t.gsis {
        attributes.extend([*pk, *sk]);
    }
    let mut create = dynamo
        .create_table()
        .table_name(&t.name)
        .billing_mode(BillingMode::PayPerRequest);
    for a in attributes {
        create = create.attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(a)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .map_err(err)?,
        );
    }
    for (a, kind) in &t.keys {
        create = create.key_schema(key_element(a, kind)?);
    }
    for (name, pk, sk) in &t.gsis {
        create = create.global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(*name)
                .key_schema(key_element(pk, "HASH")?)
                .key_schema(key_element(sk, "RANGE")?)
                .projection(
                    Projection::builder()
                        .projection_type(crate::dynamo::GSI_PROJECTION)
                        .build(),
                )
                .build()
                .map_err(err)?,
        );
    }
    if let Some(view) = t.stream {
        create = create.stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::from(view))
                .build()
                .map_err(err)?,
        );
    }
    create.send().await.map_err(|e| {
        format!(
            "table {}: {}",
            t.name,
            aws_sdk_dynamodb::error::DisplayErrorContext(e)
        )
    })?;
    dynamo
        .update_time_to_live()
        .table_name(&t.name)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .enabled(true)
                .attribute_name(t.ttl_attribute)
                .build()
                .map_err(err)?,
        )
        .send()
        .await
        .map_err(|e| {
            format!(
                "ttl of {}: {}",
                t.name,
                aws_sdk_dynamodb::error::DisplayErrorContext(e)
            )
        })?;
    Ok(())
}

fn key_element(attribute: &str, kind: &str) -> Result<KeySchemaElement, String> {
    KeySchemaElement::builder()
        .attribute_name(attribute)
        .key_type(KeyType::from(kind))
        .build()
        .map_err(err)
}

async fn create_queue(sqs: &aws_sdk_sqs::Client, q: &QueueSpec) -> Result<(), String> {
    let mut create = sqs
        .create_queue()
        .queue_name(&q.name)
        .attributes(
            QueueAttributeName::VisibilityTimeout,
            q.visibility_timeout_s.to_string(),
        )
        .attributes(
            QueueAttributeName::MessageRetentionPeriod,
            q.retention_s.to_string(),
        );
    if let Some((dlq, max)) = &q.redrive {
        let url = sqs
            .get_queue_url()
            .queue_name(dlq)
            .send()
            .await
            .map_err(|e| {
                format!(
                    "queue {dlq}: {}",
                    aws_sdk_sqs::error::DisplayErrorContext(e)
                )
            })?;
        let arn = queue_arn(sqs, url.queue_url().unwrap_or_default()).await?;
        let policy = serde_json::json!({ "deadLetterTargetArn": arn, "maxReceiveCount": max });
        create = create.attributes(QueueAttributeName::RedrivePolicy, policy.to_string());
    }
    create.send().await.map_err(|e| {
        format!(
            "queue {}: {}",
            q.name,
            aws_sdk_sqs::error::DisplayErrorContext(e)
        )
    })?;
    Ok(())
}
