//! The Lambda handlers fed real event JSON shapes (as Lambda delivers them), including
//! partial batch failure responses.

use std::time::Duration;

use aws_lambda_events::event::sqs::SqsEvent;
use entrega_aws::lambda::{delivery_batch, failure_batch, outbox_batch, outbox_records};
use entrega_core::handlers::task::DeliveryTask;
use entrega_core::ids::DeliveryId;
use entrega_core::retry::{CustomRetry, RetrySpec};
use entrega_testkit::{eventually, Receiver};
use serde_json::json;

use crate::harness::Stack;
use crate::support::*;

/// A DynamoDB stream event as Lambda sends it (NEW_IMAGE, with an INSERT to fan out
/// and a TTL REMOVE to ignore).
fn stream_event(records: serde_json::Value) -> aws_lambda_events::event::dynamodb::Event {
    serde_json::from_value(json!({ "Records": records })).unwrap()
}

fn stream_record(seq: &str, name: &str, image: serde_json::Value) -> serde_json::Value {
    json!({
        "eventID": format!("id-{seq}"),
        "eventName": name,
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": "us-east-1",
        "dynamodb": {
            "ApproximateCreationDateTime": 1796000000.0,
            "Keys": {"pk": image["pk"].clone()},
            "NewImage": image,
            "SequenceNumber": seq,
            "SizeBytes": 120,
            "StreamViewType": "NEW_IMAGE"
        },
        "eventSourceARN": "arn:aws:dynamodb:us-east-1:123456789012:table/entrega-test-outbox/stream/2026-11-30T00:00:00.000"
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn stream_and_sqs_events_in_lambda_shapes_with_partial_failures() {
    let stack = Stack::provisioned(std::sync::Arc::new(entrega_core::ports::SystemClock)).await;
    let s = &stack.services;
    let tenant = tenant(s).await;
    let receiver = Receiver::answering(503).await;
    let ep = endpoint(
        s,
        &tenant,
        receiver.url("/"),
        RetrySpec::Custom(CustomRetry {
            delays_s: vec![45],
            jitter: 0.0,
            retry_4xx: false,
        }),
    )
    .await;

    // The stream event: the INSERT fans out (deliveries created), the REMOVE is skipped.
    let e = event(s, &tenant, "a.b", r#"{"x":1}"#);
    s.store.publish(&e).await.unwrap();
    let image = json!({
        "pk": {"S": e.id.as_str()}, "tenant_id": {"S": tenant.as_str()}, "type": {"S": "a.b"},
        "payload": {"S": e.payload}, "created_at": {"S": entrega_core::event::format_timestamp(e.created_at)}
    });
    let malformed = json!({"pk": {"S": "bad.id"}, "tenant_id": {"S": tenant.as_str()}});
    let records = outbox_records(stream_event(json!([
        stream_record("100", "INSERT", image.clone()),
        stream_record("150", "INSERT", malformed),
        stream_record("200", "REMOVE", image),
    ])));
    assert_eq!(records.len(), 3);
    let quarantine = entrega_aws::sqs::SqsQueue::new(
        aws_sdk_sqs::Client::new(&stack.sdk),
        stack.resources.outbox_dlq_url.clone(),
    );
    let response = outbox_batch(s, &quarantine, records).await;
    assert!(
        response.batch_item_failures.is_empty(),
        "a malformed item never blocks the shard"
    );
    // It is in the outbox DLQ with its reason, not dropped.
    let parked = aws_sdk_sqs::Client::new(&stack.sdk)
        .receive_message()
        .queue_url(&stack.resources.outbox_dlq_url)
        .send()
        .await
        .unwrap();
    let body: serde_json::Value =
        serde_json::from_str(parked.messages()[0].body().unwrap()).unwrap();
    assert_eq!(body["kind"], "malformed_outbox_item");
    assert_eq!(body["sequence_number"], "150");
    assert!(!body["reason"].as_str().unwrap().is_empty());
    let id = DeliveryId::for_event(&e.id, &ep.id, e.created_at.timestamp_millis());
    assert!(
        s.store.get_delivery(&id).await.unwrap().is_some(),
        "fanned out"
    );

    // The SQS event: the fan-out queued the task; this test plays Lambda (no pollers
    // run here), takes the message so its receipt handle is real, and hands it over in
    // a Lambda-shaped event beside an unreadable one.
    let sqs = aws_sdk_sqs::Client::new(&stack.sdk);
    let queue = &stack.resources.delivery_queue_url;
    let held = eventually(Duration::from_secs(20), "the queued task", || async {
        let out = sqs
            .receive_message()
            .queue_url(queue)
            .max_number_of_messages(10)
            .send()
            .await
            .unwrap();
        out.messages()
            .iter()
            .find(|m| {
                m.body()
                    .and_then(|b| serde_json::from_str::<DeliveryTask>(b).ok())
                    .is_some_and(|t| t.delivery_id == id)
            })
            .cloned()
    })
    .await;
    let body = held.body().unwrap().to_owned();
    let event: SqsEvent = serde_json::from_value(json!({"Records": [
        {
            "messageId": held.message_id().unwrap(),
            "receiptHandle": held.receipt_handle().unwrap(),
            "body": body,
            "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1796000000000",
                           "SenderId": "AIDAEXAMPLE", "ApproximateFirstReceiveTimestamp": "1796000000001"},
            "messageAttributes": {},
            "md5OfBody": "0",
            "eventSource": "aws:sqs",
            "eventSourceARN": stack.resources.delivery_queue_arn,
            "awsRegion": "us-east-1"
        },
        {
            "messageId": "garbage-1",
            "receiptHandle": "rh-garbage",
            "body": "{not a task",
            "attributes": {}, "messageAttributes": {}, "md5OfBody": "0",
            "eventSource": "aws:sqs", "eventSourceARN": stack.resources.delivery_queue_arn, "awsRegion": "us-east-1"
        }
    ]}))
    .unwrap();
    let response = delivery_batch(s, event).await;
    let failed: Vec<_> = response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect();
    // A 503 with 45 s to wait: kept (reported failed, hidden by visibility; a wait
    // over a minute would be sent again delayed). The unreadable one is done with (not
    // reported, so Lambda deletes it).
    assert_eq!(failed, [held.message_id().unwrap().to_owned()]);
    let wire = serde_json::to_value(&response).unwrap();
    assert_eq!(
        wire["batchItemFailures"][0]["itemIdentifier"],
        held.message_id().unwrap()
    );
}

/// The API function's router on the stack's services, and an admin key it accepts.
async fn api_function(stack: &Stack) -> (axum::Router, String) {
    let app = entrega_http::api::router(entrega_http::api::App {
        services: stack.services.clone(),
        targets: std::sync::Arc::new(entrega_http::transport::TargetPolicy::default()),
        limiter: None,
        conditions: Default::default(),
        waiting: None,
        publisher: None,
    });
    let admin_key = entrega_core::tenant::generate_api_key();
    stack
        .services
        .store
        .put_api_key(
            &entrega_core::tenant::hash_api_key(&admin_key),
            &entrega_core::tenant::Principal::Admin,
        )
        .await
        .unwrap();
    (app, admin_key)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_api_function_serves_api_gateway_v2_requests() {
    use lambda_http::tower::ServiceExt;
    let stack = Stack::start().await;
    let (app, admin_key) = api_function(&stack).await;
    let apigw = json!({
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": "/v1/tenants",
        "rawQueryString": "",
        "headers": {"authorization": format!("Bearer {admin_key}"), "content-type": "application/json", "host": "api.example.com"},
        "requestContext": {
            "accountId": "123456789012", "apiId": "api", "domainName": "api.example.com", "domainPrefix": "api",
            "http": {"method": "POST", "path": "/v1/tenants", "protocol": "HTTP/1.1", "sourceIp": "192.0.2.1", "userAgent": "curl"},
            "requestId": "r1", "routeKey": "$default", "stage": "$default", "time": "30/Nov/2026:12:00:00 +0000", "timeEpoch": 1796000000000u64
        },
        "body": "{\"name\":\"Acme\",\"owner_email\":\"ops@acme.example\"}",
        "isBase64Encoded": false
    });
    let request: lambda_http::request::LambdaRequest = serde_json::from_value(apigw).unwrap();
    let request: lambda_http::Request = request.into();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 201);
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(body["api_key"].as_str().unwrap().starts_with("ent_"));
    let tenant: entrega_core::ids::TenantId =
        body["tenant"]["id"].as_str().unwrap().parse().unwrap();
    assert!(
        stack
            .services
            .store
            .get_tenant(&tenant)
            .await
            .unwrap()
            .is_some(),
        "stored in DynamoDB"
    );
}

/// An API Gateway HTTP API (v2) event for `GET path`, as API Gateway sends it.
fn apigw_get(path: &str, authorization: Option<&str>) -> lambda_http::request::LambdaRequest {
    let mut headers = json!({"host": "api.example.com", "accept": "*/*"});
    if let Some(auth) = authorization {
        headers["authorization"] = json!(auth);
    }
    serde_json::from_value(json!({
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": "",
        "headers": headers,
        "requestContext": {
            "accountId": "123456789012", "apiId": "api", "domainName": "api.example.com", "domainPrefix": "api",
            "http": {"method": "GET", "path": path, "protocol": "HTTP/1.1", "sourceIp": "192.0.2.1", "userAgent": "Chromium"},
            "requestId": "r1", "routeKey": "$default", "stage": "$default", "time": "30/Nov/2026:12:00:00 +0000", "timeEpoch": 1796000000000u64
        },
        "isBase64Encoded": false
    }))
    .unwrap()
}

/// The console is served by the API function: through the same adapter `lambda_http`
/// runs in Lambda, the page and its files come back as API Gateway receives them —
/// text bodies, their content types, the CSP and frame headers — and API answers are
/// never cached.
#[tokio::test(flavor = "multi_thread")]
async fn the_api_function_serves_the_console() {
    use lambda_http::tower::{Service, ServiceExt};
    let stack = Stack::start().await;
    let (app, admin_key) = api_function(&stack).await;
    let mut lambda = lambda_http::Adapter::from(app);
    let mut get = async |path: &str, auth: Option<&str>| -> serde_json::Value {
        let event =
            lambda_http::LambdaEvent::new(apigw_get(path, auth), lambda_http::Context::default());
        let response = lambda.ready().await.unwrap().call(event).await.unwrap();
        serde_json::to_value(&response).unwrap()
    };
    for (path, content_type, needle) in [
        (
            "/console",
            "text/html; charset=utf-8",
            "<script type=\"module\" src=\"/console/app.js\">",
        ),
        (
            "/console/app.js",
            "text/javascript; charset=utf-8",
            "sessionStorage",
        ),
        (
            "/console/api.js",
            "text/javascript; charset=utf-8",
            "Authorization",
        ),
        (
            "/console/console.css",
            "text/css; charset=utf-8",
            ":focus-visible",
        ),
        ("/console/icon.svg", "image/svg+xml", "<svg"),
    ] {
        let response = get(path, None).await;
        assert_eq!(response["statusCode"], 200, "{path}: {response}");
        let headers = &response["headers"];
        assert_eq!(headers["content-type"], content_type, "{path}");
        assert_eq!(
            headers["content-security-policy"],
            entrega_http::console::CONTENT_SECURITY_POLICY,
            "{path}"
        );
        assert_eq!(headers["x-frame-options"], "DENY", "{path}");
        assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(response["isBase64Encoded"], false, "{path}: sent as text");
        assert!(
            response["body"].as_str().unwrap().contains(needle),
            "{path}: {}",
            response["body"]
        );
    }
    let missing = get("/console/nope.js", None).await;
    assert_eq!(missing["statusCode"], 404, "{missing}");
    let api = get("/v1/tenants", Some(&format!("Bearer {admin_key}"))).await;
    assert_eq!(api["statusCode"], 200, "{api}");
    assert_eq!(api["headers"]["cache-control"], "no-store", "{api}");
    assert_eq!(api["headers"]["x-frame-options"], "DENY", "{api}");
    assert_eq!(
        api["headers"]["content-security-policy"], "default-src 'none'; frame-ancestors 'none'",
        "{api}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_analyzer_reports_only_the_notices_it_could_not_record() {
    use entrega_core::delivery::Delivery;
    use entrega_core::failure::{FailureNotice, FailureReason};
    let stack = Stack::provisioned(std::sync::Arc::new(entrega_core::ports::SystemClock)).await;
    let s = &stack.services;
    let tenant = tenant(s).await;
    let ep = endpoint(
        s,
        &tenant,
        "https://hooks.example.com/".into(),
        RetrySpec::default(),
    )
    .await;
    // A delivery whose event is in the outbox, and one whose event is not (a broken
    // store: that notice cannot be recorded and must come back).
    let good = event(s, &tenant, "a.b", "{}");
    s.store.publish(&good).await.unwrap();
    let orphan = event(s, &tenant, "a.b", "{}");
    let mut records = Vec::new();
    for (i, e) in [&good, &orphan].into_iter().enumerate() {
        let d = Delivery::new(
            DeliveryId::for_event(&e.id, &ep.id, 0),
            e,
            ep.id.clone(),
            false,
            s.clock.now(),
        );
        s.store.create_delivery_if_absent(&d).await.unwrap();
        let notice = FailureNotice {
            delivery_id: d.id.clone(),
            tenant_id: tenant.clone(),
            generation: 0,
            reason: FailureReason::Exhausted,
            failed_at: s.clock.now(),
        };
        // Receipt handles SQS does not know: hiding the failed one fails, which the
        // glue logs and survives (the message still returns, after the queue's timeout).
        records.push(json!({
            "messageId": format!("m-{i}"),
            "receiptHandle": format!("unknown-handle-{i}"),
            "body": serde_json::to_string(&notice).unwrap(),
            "attributes": {"ApproximateReceiveCount": "1"}, "messageAttributes": {}, "md5OfBody": "0",
            "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:entrega-test-failures",
            "awsRegion": "us-east-1"
        }));
    }
    let event: SqsEvent = serde_json::from_value(json!({ "Records": records })).unwrap();
    let response = failure_batch(s, event).await;
    let failed: Vec<_> = response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect();
    assert_eq!(
        failed,
        ["m-1"],
        "only the notice that could not be recorded is kept"
    );
}
