//! `template.yaml` declares exactly the tables, queues, schedule group and topic that
//! `entrega provision` creates (one spec for both), and names what the functions need.

use std::collections::BTreeMap;

use entrega_aws::provision::spec;
use entrega_aws::resources::ResourceNames;
use serde_norway::Value;

fn template() -> BTreeMap<String, Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../template.yaml");
    let doc: Value = serde_norway::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    serde_norway::from_value(doc["Resources"].clone()).unwrap()
}

/// A `!Sub "..."` (or plain string) property as text.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Tagged(t) => text(&t.value),
        Value::Number(n) => n.to_string(),
        other => panic!("not text: {other:?}"),
    }
}

fn of_type<'a>(resources: &'a BTreeMap<String, Value>, kind: &str) -> Vec<(&'a String, &'a Value)> {
    resources
        .iter()
        .filter(|(_, r)| r["Type"].as_str() == Some(kind))
        .collect()
}

fn names() -> ResourceNames {
    ResourceNames::with_prefix("${AWS::StackName}")
}

#[test]
fn tables_match_the_provisioning_spec() {
    let resources = template();
    let tables = of_type(&resources, "AWS::DynamoDB::Table");
    let expected = spec(&names()).tables;
    assert_eq!(tables.len(), expected.len(), "exactly the spec's tables");
    for want in expected {
        let (_, table) = tables
            .iter()
            .find(|(_, t)| text(&t["Properties"]["TableName"]) == want.name)
            .unwrap_or_else(|| panic!("no table {}", want.name));
        let p = &table["Properties"];
        let keys: Vec<(String, String)> = p["KeySchema"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|k| (text(&k["AttributeName"]), text(&k["KeyType"])))
            .collect();
        let want_keys: Vec<(String, String)> = want
            .keys
            .iter()
            .map(|(a, k)| (a.to_string(), k.to_string()))
            .collect();
        assert_eq!(keys, want_keys, "{}", want.name);
        let gsis: Vec<(String, String, String)> = p["GlobalSecondaryIndexes"]
            .as_sequence()
            .map(|s| {
                s.iter()
                    .map(|g| {
                        let ks = g["KeySchema"].as_sequence().unwrap();
                        (
                            text(&g["IndexName"]),
                            text(&ks[0]["AttributeName"]),
                            text(&ks[1]["AttributeName"]),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let want_gsis: Vec<(String, String, String)> = want
            .gsis
            .iter()
            .map(|(n, p, s)| (n.to_string(), p.to_string(), s.to_string()))
            .collect();
        assert_eq!(gsis, want_gsis, "{}", want.name);
        for g in p["GlobalSecondaryIndexes"]
            .as_sequence()
            .into_iter()
            .flatten()
        {
            assert_eq!(
                text(&g["Projection"]["ProjectionType"]),
                entrega_aws::dynamo::GSI_PROJECTION.as_str(),
                "{}: the template projects what provisioning does",
                want.name
            );
        }
        let stream = p["StreamSpecification"]["StreamViewType"].as_str();
        assert_eq!(stream, want.stream, "{}", want.name);
        assert_eq!(
            text(&p["TimeToLiveSpecification"]["AttributeName"]),
            want.ttl_attribute
        );
        assert_eq!(
            p["TimeToLiveSpecification"]["Enabled"].as_bool(),
            Some(true)
        );
    }
}

#[test]
fn queues_match_the_provisioning_spec() {
    let resources = template();
    let queues = of_type(&resources, "AWS::SQS::Queue");
    let expected = spec(&names()).queues;
    assert_eq!(queues.len(), expected.len(), "exactly the spec's queues");
    let logical_of = |name: &str| {
        queues
            .iter()
            .find(|(_, q)| text(&q["Properties"]["QueueName"]) == name)
            .map(|(id, q)| (id.to_string(), *q))
            .unwrap_or_else(|| panic!("no queue {name}"))
    };
    for want in expected {
        let (_, queue) = logical_of(&want.name);
        let p = &queue["Properties"];
        assert_eq!(
            text(&p["VisibilityTimeout"]),
            want.visibility_timeout_s.to_string(),
            "{}",
            want.name
        );
        assert_eq!(
            text(&p["MessageRetentionPeriod"]),
            want.retention_s.to_string(),
            "{}",
            want.name
        );
        match want.redrive {
            Some((dlq, max)) => {
                let (dlq_id, _) = logical_of(&dlq);
                let target = text(&p["RedrivePolicy"]["deadLetterTargetArn"]);
                assert_eq!(target, format!("{dlq_id}.Arn"), "{}", want.name);
                assert_eq!(
                    text(&p["RedrivePolicy"]["maxReceiveCount"]),
                    max.to_string()
                );
            }
            None => assert!(
                p.get("RedrivePolicy").is_none(),
                "{} has no redrive",
                want.name
            ),
        }
    }
}

#[test]
fn scheduler_topic_and_function_wiring() {
    let resources = template();
    let spec = spec(&names());
    let groups = of_type(&resources, "AWS::Scheduler::ScheduleGroup");
    assert_eq!(groups.len(), 1);
    assert_eq!(
        text(&groups[0].1["Properties"]["Name"]),
        spec.schedule_group
    );
    let mut topics: Vec<String> = of_type(&resources, "AWS::SNS::Topic")
        .iter()
        .map(|(_, t)| text(&t["Properties"]["TopicName"]))
        .collect();
    topics.sort();
    assert_eq!(
        topics,
        [spec.alert_topic.clone(), spec.notification_topic.clone()],
        "paging and notification apart"
    );
    // The owner notices' sender is required (no made-up default) and checked as an
    // address; the stack creates its SES identity, which SES asks to confirm.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../template.yaml");
    let doc: Value = serde_norway::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let sender = &doc["Parameters"]["NoticeFromAddress"];
    assert!(sender["Default"].is_null(), "NoticeFromAddress is required");
    assert!(sender["AllowedPattern"].is_string());
    let identity = of_type(&resources, "AWS::SES::EmailIdentity");
    assert_eq!(identity.len(), 1);
    assert!(
        format!("{:?}", identity[0].1["Properties"]["EmailIdentity"]).contains("NoticeFromAddress")
    );

    let functions = of_type(&resources, "AWS::Serverless::Function");
    let mut dirs: Vec<String> = functions
        .iter()
        .map(|(_, f)| text(&f["Properties"]["CodeUri"]))
        .collect();
    dirs.sort();
    assert_eq!(
        dirs,
        [
            "functions/api",
            "functions/delivery-worker",
            "functions/dlq-analyzer",
            "functions/outbox-trigger"
        ]
    );
    for (id, f) in &functions {
        assert_eq!(
            f["Metadata"]["BuildMethod"].as_str(),
            Some("rust-cargolambda"),
            "{id}"
        );
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../").to_owned()
            + &text(&f["Properties"]["CodeUri"]);
        assert!(
            std::path::Path::new(&dir).join("Cargo.toml").exists(),
            "{id}: {dir} is a crate"
        );
    }
    let worker = &resources["DeliveryWorkerFunction"]["Properties"];
    let policy = serde_norway::to_string(&worker["Policies"]).unwrap();
    for action in [
        "sqs:ChangeMessageVisibility",
        "scheduler:CreateSchedule",
        "iam:PassRole",
    ] {
        assert!(policy.contains(action), "the worker may {action}");
    }
    let trigger =
        &resources["OutboxTriggerFunction"]["Properties"]["Events"]["Outbox"]["Properties"];
    assert!(serde_norway::to_string(&trigger["FilterCriteria"])
        .unwrap()
        .contains("INSERT"));
    assert_eq!(trigger["BisectBatchOnFunctionError"].as_bool(), Some(true));
    assert_eq!(
        trigger["ParallelizationFactor"].as_u64(),
        Some(10),
        "a shard's batches are fanned out side by side"
    );
    for (id, f) in &functions {
        if let Some(events) = f["Properties"]["Events"].as_mapping() {
            for (_, e) in events {
                if matches!(e["Type"].as_str(), Some("SQS" | "DynamoDB")) {
                    let types =
                        serde_norway::to_string(&e["Properties"]["FunctionResponseTypes"]).unwrap();
                    assert!(
                        types.contains("ReportBatchItemFailures"),
                        "{id} reports batch item failures"
                    );
                }
            }
        }
    }
}

/// Every alarm the README has a runbook for is in the template, and the reverse.
#[test]
fn the_readme_has_a_runbook_for_exactly_the_template_alarms() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let section = readme
        .split("### Alarms")
        .nth(1)
        .expect("an alarms section")
        .split("\n## ")
        .next()
        .unwrap();
    let mut documented: Vec<String> = section
        .split("**`<stack>-")
        .skip(1)
        .map(|rest| rest.split('`').next().unwrap().to_owned())
        .collect();
    documented.sort();
    documented.dedup();
    let resources = template();
    let mut declared: Vec<String> = of_type(&resources, "AWS::CloudWatch::Alarm")
        .iter()
        .map(|(_, a)| {
            text(&a["Properties"]["AlarmName"])
                .trim_start_matches("${AWS::StackName}-")
                .to_owned()
        })
        .collect();
    declared.sort();
    assert_eq!(documented, declared, "README runbooks vs template alarms");
    assert!(declared.len() >= 12, "{declared:?}");
    for (_, alarm) in of_type(&resources, "AWS::CloudWatch::Alarm") {
        let actions = serde_norway::to_string(&alarm["Properties"]["AlarmActions"]).unwrap();
        assert!(
            actions.contains("AlertTopic"),
            "every alarm notifies on-call"
        );
    }
}

#[test]
fn the_dashboard_body_is_json_with_the_four_views() {
    let resources = template();
    let dashboards = of_type(&resources, "AWS::CloudWatch::Dashboard");
    assert_eq!(dashboards.len(), 1);
    let body = text(&dashboards[0].1["Properties"]["DashboardBody"])
        .replace("${AWS::Region}", "us-east-1");
    let body: serde_json::Value = serde_json::from_str(&body).expect("the dashboard body is JSON");
    let titles: Vec<String> = body["widgets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["properties"]["title"].as_str().unwrap().to_lowercase())
        .collect();
    for want in [
        "delivery rate",
        "success ratio",
        "latency",
        "failures by tenant",
    ] {
        assert!(
            titles.iter().any(|t| t.contains(want)),
            "{want} in {titles:?}"
        );
    }
}

/// The account is protected from Entrega's own load: the worker's concurrency is
/// reserved and its queue trigger capped to it, the HTTP API is throttled as a whole,
/// every function's logs expire, and no IAM statement grants `*` as its resource.
#[test]
fn the_account_is_protected_and_permissions_are_named() {
    let resources = template();
    let worker = &resources["DeliveryWorkerFunction"]["Properties"];
    let reserved = format!("{:?}", worker["ReservedConcurrentExecutions"]);
    assert!(reserved.contains("WorkerConcurrency"), "{reserved}");
    let cap = format!(
        "{:?}",
        worker["Events"]["Deliveries"]["Properties"]["ScalingConfig"]["MaximumConcurrency"]
    );
    assert!(cap.contains("WorkerConcurrency"), "{cap}");
    let api = &resources["HttpApi"]["Properties"]["DefaultRouteSettings"];
    assert!(!api["ThrottlingRateLimit"].is_null() && !api["ThrottlingBurstLimit"].is_null());

    let functions = of_type(&resources, "AWS::Serverless::Function");
    let logs: Vec<String> = of_type(&resources, "AWS::Logs::LogGroup")
        .iter()
        .map(|(_, g)| {
            assert!(!g["Properties"]["RetentionInDays"].is_null());
            text(&g["Properties"]["LogGroupName"])
        })
        .collect();
    for (id, _) in &functions {
        assert!(
            logs.iter().any(|l| l.contains(&format!("${{{id}}}"))),
            "{id} has a log group with a retention"
        );
    }
    for (id, f) in &functions {
        let policies = format!("{:?}", f["Properties"]["Policies"]);
        assert!(
            !policies.contains("String(\"*\")"),
            "{id} grants a `*` resource: {policies}"
        );
    }
}

/// The shortest retention the stack accepts outlasts every preset's retries at their
/// latest (each delay at its upper jitter bound): an event expires that long after it
/// was published, and a preset's retry must still find it.
#[test]
fn the_shortest_retention_outlasts_the_presets_retries() {
    use entrega_core::retry::{RetryPreset, RetrySpec};
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../template.yaml");
    let doc: Value = serde_norway::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let days = doc["Parameters"]["RetentionDays"]["MinValue"]
        .as_u64()
        .expect("RetentionDays has a MinValue");
    for preset in [RetryPreset::Standard, RetryPreset::Persistent] {
        let policy = RetrySpec::Preset(preset).policy().unwrap();
        let latest: f64 = policy
            .delays()
            .iter()
            .map(|d| d.as_secs_f64() * (1.0 + policy.jitter()))
            .sum();
        assert!(
            latest < (days * 86_400) as f64,
            "{preset:?}: the last retry {latest} s after the event, past the shortest retention ({days} days)"
        );
    }
}
