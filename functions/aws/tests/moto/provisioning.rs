//! `entrega provision --backend aws` on the emulator: idempotent, and what it creates
//! is what the spec (and so the template) declares.

use entrega_aws::provision::{provision, spec};
use entrega_aws::resources::ResourceNames;

use crate::harness::sdk;
use entrega_testkit::Moto;

#[tokio::test(flavor = "multi_thread")]
async fn provisioning_is_idempotent_and_creates_the_spec() {
    let moto = Moto::start();
    let sdk = sdk(&moto).await;
    let names = ResourceNames::with_prefix("prov");
    provision(&sdk, &names).await.unwrap();
    provision(&sdk, &names)
        .await
        .expect("a second run changes nothing and does not fail");
    let expected = spec(&names);

    let dynamo = aws_sdk_dynamodb::Client::new(&sdk);
    for table in &expected.tables {
        let t = dynamo
            .describe_table()
            .table_name(&table.name)
            .send()
            .await
            .unwrap();
        let t = t.table().unwrap();
        let keys: Vec<(String, String)> = t
            .key_schema()
            .iter()
            .map(|k| {
                (
                    k.attribute_name().to_owned(),
                    k.key_type().as_str().to_owned(),
                )
            })
            .collect();
        let want: Vec<(String, String)> = table
            .keys
            .iter()
            .map(|(a, k)| (a.to_string(), k.to_string()))
            .collect();
        assert_eq!(keys, want, "{}", table.name);
        let mut gsis: Vec<String> = t
            .global_secondary_indexes()
            .iter()
            .filter_map(|g| g.index_name().map(str::to_owned))
            .collect();
        gsis.sort();
        let want: Vec<String> = table.gsis.iter().map(|g| g.0.to_owned()).collect();
        assert_eq!(gsis, want);
        let stream = t
            .stream_specification()
            .and_then(|s| s.stream_view_type())
            .map(|v| v.as_str().to_owned());
        assert_eq!(stream.as_deref(), table.stream);
        let ttl = dynamo
            .describe_time_to_live()
            .table_name(&table.name)
            .send()
            .await
            .unwrap();
        assert_eq!(
            ttl.time_to_live_description()
                .and_then(|d| d.attribute_name()),
            Some(table.ttl_attribute)
        );
    }
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    for queue in &expected.queues {
        let url = sqs
            .get_queue_url()
            .queue_name(&queue.name)
            .send()
            .await
            .unwrap();
        let attrs = sqs
            .get_queue_attributes()
            .queue_url(url.queue_url().unwrap())
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::All)
            .send()
            .await
            .unwrap();
        let attrs = attrs.attributes().unwrap();
        let get =
            |n: aws_sdk_sqs::types::QueueAttributeName| attrs.get(&n).cloned().unwrap_or_default();
        assert_eq!(
            get(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout),
            queue.visibility_timeout_s.to_string()
        );
        let redrive = get(aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy);
        match &queue.redrive {
            Some((dlq, max)) => {
                let policy: serde_json::Value = serde_json::from_str(&redrive).unwrap();
                assert!(policy["deadLetterTargetArn"]
                    .as_str()
                    .unwrap()
                    .ends_with(dlq.as_str()));
                assert_eq!(
                    policy["maxReceiveCount"].to_string().trim_matches('"'),
                    max.to_string()
                );
            }
            None => assert!(redrive.is_empty(), "{} has no redrive", queue.name),
        }
    }
    let scheduler = aws_sdk_scheduler::Client::new(&sdk);
    scheduler
        .get_schedule_group()
        .name(&expected.schedule_group)
        .send()
        .await
        .expect("the schedule group exists");
}

/// A Lambda function's SDK configuration (region, credentials and endpoint from the
/// environment Lambda sets, no default chain) reaches the services; a missing variable
/// is named.
#[tokio::test(flavor = "multi_thread")]
async fn the_lambda_sdk_configuration_talks_to_the_services() {
    let stack =
        crate::harness::Stack::provisioned(std::sync::Arc::new(entrega_core::ports::SystemClock))
            .await;
    let endpoint = stack.sdk.endpoint_url().unwrap().to_owned();
    let vars = std::collections::HashMap::from([
        ("AWS_REGION", "us-east-1".to_owned()),
        ("AWS_ACCESS_KEY_ID", "test".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "test".to_owned()),
        ("AWS_SESSION_TOKEN", "token".to_owned()),
        ("AWS_ENDPOINT_URL", endpoint),
    ]);
    let config =
        entrega_aws::resources::lambda_sdk_config_from(|name| vars.get(name).cloned()).unwrap();
    let queues = aws_sdk_sqs::Client::new(&config)
        .list_queues()
        .send()
        .await
        .unwrap();
    assert!(queues
        .queue_urls()
        .contains(&stack.resources.delivery_queue_url));

    let without_region = entrega_aws::resources::lambda_sdk_config_from(|name| {
        (name != "AWS_REGION")
            .then(|| vars.get(name).cloned())
            .flatten()
    });
    assert_eq!(without_region.unwrap_err(), "AWS_REGION is not set");
}
