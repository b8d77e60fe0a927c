//! Failure handling on AWS: records in DynamoDB, one threshold alert through SNS, owner
//! notices through SES.

use std::sync::Arc;
use std::time::Duration;

use entrega_aws::sns::AwsNotifier;
use entrega_core::failure::FailureQuery;
use entrega_core::ports::{Audience, Notice, SystemClock};
use entrega_core::retry::{RetryPreset, RetrySpec};
use entrega_testkit::{eventually, Receiver};

use crate::harness::Stack;
use crate::support::*;

#[tokio::test(flavor = "multi_thread")]
async fn failures_are_recorded_alerted_once_through_sns_and_owners_emailed() {
    let mut stack = Stack::provisioned(Arc::new(SystemClock)).await;
    stack.services.settings.alert_threshold = 2;
    // On-call's view of the topic: an SQS queue subscribed to it.
    let sqs = aws_sdk_sqs::Client::new(&stack.sdk);
    let sns = aws_sdk_sns::Client::new(&stack.sdk);
    let inbox = sqs
        .create_queue()
        .queue_name("on-call-inbox")
        .send()
        .await
        .unwrap();
    let inbox_url = inbox.queue_url().unwrap().to_owned();
    let inbox_arn = entrega_aws::resources::queue_arn(&sqs, &inbox_url)
        .await
        .unwrap();
    sns.subscribe()
        .topic_arn(&stack.resources.notification_topic_arn)
        .protocol("sqs")
        .endpoint(&inbox_arn)
        .attributes("RawMessageDelivery", "true")
        .send()
        .await
        .unwrap();
    stack.start_pollers();

    let s = stack.services.clone();
    let tenant = tenant(&s).await;
    let receiver = Receiver::answering(500).await;
    endpoint(
        &s,
        &tenant,
        receiver.url("/"),
        RetrySpec::Preset(RetryPreset::None),
    )
    .await;
    for i in 0..4 {
        let e = event(&s, &tenant, "a.b", "{}");
        assert!(move_lead_stage(&stack, &format!("L{i}"), &e, false).await);
    }
    let query = FailureQuery {
        tenant: Some(tenant.clone()),
        acknowledged: None,
        limit: 50,
        cursor: None,
    };
    eventually(
        Duration::from_secs(40),
        "4 failure records in DynamoDB",
        || async { (s.store.list_failures(&query).await.unwrap().data.len() == 4).then_some(()) },
    )
    .await;
    let alerts = eventually(Duration::from_secs(20), "an alert on the topic", || async {
        let out = sqs
            .receive_message()
            .queue_url(&inbox_url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        let bodies: Vec<serde_json::Value> = out
            .messages()
            .iter()
            .filter_map(|m| serde_json::from_str(m.body()?).ok())
            .collect();
        (!bodies.is_empty()).then_some(bodies)
    })
    .await;
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert_eq!(alerts[0]["kind"], "failure_threshold");
    assert_eq!(alerts[0]["tenant_id"], tenant.as_str());
    assert_eq!(alerts[0]["details"]["count"], 3);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let more = sqs
        .receive_message()
        .queue_url(&inbox_url)
        .max_number_of_messages(10)
        .send()
        .await
        .unwrap();
    assert!(
        more.messages().is_empty(),
        "one alert per tenant and hour, not one per failure"
    );

    // Owner notices go out through SES, from the sender provisioning verified…
    let owner = Notice {
        kind: entrega_core::ports::NoticeKind::DeliveryExhausted,
        audience: Audience::Owner {
            email: "owner@example.com".into(),
        },
        tenant_id: tenant.clone(),
        summary: "a webhook could not be delivered".into(),
        details: serde_json::json!({ "resend": "entrega resend dlv_x" }),
    };
    s.notifier
        .notify(&owner)
        .await
        .expect("SES accepts the verified sender");
    // …and a sender nobody verified is refused: the call really reaches SES.
    let unverified = AwsNotifier::new(
        sns.clone(),
        stack.resources.notification_topic_arn.clone(),
        aws_sdk_sesv2::Client::new(&stack.sdk),
        "nobody@unverified.example".into(),
    );
    use entrega_core::ports::Notifier;
    assert!(unverified.notify(&owner).await.is_err());
}

/// The store conformance suite, on DynamoDB (moto): the same promises as SQLite's.
#[tokio::test(flavor = "multi_thread")]
async fn the_dynamodb_store_conforms() {
    use entrega_testkit::conformance::*;
    let stack = crate::harness::Stack::provisioned(Arc::new(SystemClock)).await;
    let store =
        entrega_aws::resources::dynamo_store(&stack.sdk, &stack.resources, Arc::new(SystemClock));
    every_promise(&store).await;
    endpoint_slots_cap_each_endpoint(&store).await;
}

/// A tenant whose endpoints were stored before the endpoint count existed (its count
/// item absent) is counted from its endpoints at its next create: the limit still
/// holds, not restarted at zero.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_never_counted_is_counted_from_its_endpoints() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use entrega_aws::dynamo::{keys, ONLY, PK, SK};
    use entrega_core::endpoint::Endpoint;
    use entrega_core::ports::{EndpointCreated, EndpointStore};

    const LIMIT: usize = 3;
    let stack = crate::harness::Stack::provisioned(Arc::new(SystemClock)).await;
    let store =
        entrega_aws::resources::dynamo_store(&stack.sdk, &stack.resources, Arc::new(SystemClock));
    let tenant = entrega_core::ids::TenantId::generate();
    let endpoint = |n: u32| {
        Endpoint::new(
            tenant.clone(),
            format!("https://hooks.example.com/{n}"),
            chrono::Utc::now(),
        )
    };
    for n in 0..2 {
        let created = store.create_endpoint(&endpoint(n), LIMIT).await.unwrap();
        assert_eq!(created, EndpointCreated::Stored);
    }
    // As an older release left it: the endpoints, and no count.
    aws_sdk_dynamodb::Client::new(&stack.sdk)
        .delete_item()
        .table_name(&stack.resources.main_table)
        .key(PK, AttributeValue::S(keys::tenant_endpoint_count(&tenant)))
        .key(SK, AttributeValue::S(ONLY.into()))
        .send()
        .await
        .unwrap();
    let answers = [
        store.create_endpoint(&endpoint(2), LIMIT).await.unwrap(),
        store.create_endpoint(&endpoint(3), LIMIT).await.unwrap(),
    ];
    assert_eq!(
        answers,
        [EndpointCreated::Stored, EndpointCreated::TenantFull],
        "counted from the two already there"
    );
    assert_eq!(store.tenant_endpoints(&tenant).await.unwrap().len(), LIMIT);
}

/// The queue conformance suite, on SQS (moto): the same promises as the SQLite and
/// in-memory queues. Each promise gets a queue of its own.
#[tokio::test(flavor = "multi_thread")]
async fn the_sqs_queue_conforms() {
    use entrega_core::ports::MessageQueue;
    let stack = crate::harness::Stack::provisioned(Arc::new(SystemClock)).await;
    let sqs = aws_sdk_sqs::Client::new(&stack.sdk);
    entrega_testkit::conformance::every_queue_promise(
        || async {
            let name = format!("conformance-{:08x}", rand::random::<u32>());
            let created = sqs.create_queue().queue_name(name).send().await.unwrap();
            let url = created.queue_url().unwrap().to_owned();
            Arc::new(entrega_aws::sqs::SqsQueue::new(sqs.clone(), url)) as Arc<dyn MessageQueue>
        },
        entrega_testkit::conformance::StaleReceipts::AcceptedWithoutError,
    )
    .await;
}
