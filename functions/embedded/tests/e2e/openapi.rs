//! `GET /openapi.json`: a valid OpenAPI 3.1 document, and every operation in it is a
//! route the server really has.

use std::process::Command;

use serde_json::Value;

use crate::harness::*;

#[tokio::test(flavor = "multi_thread")]
async fn the_document_is_valid_and_every_operation_is_routed() {
    let dir = TempDir::new("openapi");
    let server = Server::start(&dir);
    let doc: Value = reqwest::get(format!("{}/openapi.json", server.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(doc["openapi"], "3.1.0");

    let file = dir.0.join("openapi.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    let out = Command::new(entrega_testkit::python())
        .args(["-m", "openapi_spec_validator"])
        .arg(&file)
        .output()
        .expect("the test tools' Python runs (scripts/python-tools makes it)");
    assert!(
        out.status.success(),
        "openapi-spec-validator: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let admin = server.admin();
    let mut operations = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            operations += 1;
            let concrete = path.replace("{id}", "unknown_id");
            let body = op.get("requestBody").map(|_| serde_json::json!({}));
            let (status, answer) = admin.call(&method.to_uppercase(), &concrete, body).await;
            assert_ne!(status, 405, "{method} {path} is not routed");
            let fallback = answer["detail"]
                .as_str()
                .is_some_and(|d| d.contains("no route"));
            assert!(!fallback, "{method} {path} fell through to the fallback");
            assert!(
                op["responses"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .any(|k| k.starts_with('2')),
                "{method} {path}"
            );
        }
    }
    assert!(operations >= 20, "{operations} operations documented");
    for must in [
        "/v1/deliveries/{id}/resend",
        "/v1/failures/{id}/ack",
        "/v1/endpoints/{id}/stats",
    ] {
        assert!(doc["paths"].get(must).is_some(), "{must} documented");
    }
    let problem = &doc["paths"]["/v1/endpoints"]["post"]["responses"]["422"]["content"]
        ["application/problem+json"];
    assert_eq!(problem["schema"]["$ref"], "#/components/schemas/Problem");
}
