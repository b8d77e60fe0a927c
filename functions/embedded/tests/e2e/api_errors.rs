//! Bad input gets a clear problem+json naming the field, never a 5xx.

use serde_json::json;

use crate::harness::*;

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_are_clear_problems() {
    let dir = TempDir::new("errors");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let nobody = Api {
        key: "ent_wrong".into(),
        ..acme.clone()
    };
    let (status, _) = nobody.get("/v1/endpoints").await;
    assert_eq!(status, 401);
    let raw = reqwest::get(format!("{}/v1/endpoints", server.base))
        .await
        .unwrap();
    assert_eq!(raw.status(), 401);
    assert_eq!(raw.headers()["content-type"], "application/problem+json");

    // Rejections axum makes itself are problems too: a method a route does not have,
    // a path that is not UTF-8.
    for (method, path, status) in [
        (reqwest::Method::PUT, "/v1/events", 405),
        (reqwest::Method::DELETE, "/v1/deliveries", 405),
        (reqwest::Method::GET, "/v1/events/%FF", 400),
    ] {
        let answer = reqwest::Client::new()
            .request(method.clone(), format!("{}{path}", server.base))
            .bearer_auth(&acme.key)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), status, "{method} {path}");
        assert_eq!(
            answer.headers()["content-type"],
            "application/problem+json",
            "{method} {path}"
        );
        if status == 405 {
            assert!(answer.headers().contains_key("allow"), "{method} {path}");
        }
        let body: serde_json::Value = answer.json().await.unwrap();
        assert_eq!(body["status"], status);
        assert!(!body["detail"].as_str().unwrap().is_empty(), "{body}");
    }

    let cases = [
        (
            json!({"url": "https://x.example.com/", "timeout_ms": 60000}),
            "timeout_ms",
        ),
        (
            json!({"url": "https://x.example.com/", "max_concurrency": 0}),
            "max_concurrency",
        ),
        (
            json!({"url": "https://x.example.com/", "event_types": ["lead..x"]}),
            "event_types",
        ),
        (
            json!({"url": "https://x.example.com/", "retry": {"delays_s": [1], "jitter": 0.9}}),
            "retry",
        ),
        (
            json!({"url": "https://x.example.com/", "mode": "twice"}),
            "mode",
        ),
        (json!({"url": 7}), "url"),
        (json!({"url": "not a url"}), "url"),
    ];
    for (body, field) in cases {
        let (status, problem) = acme.post("/v1/endpoints", body.clone()).await;
        assert_eq!(status, 422, "{body}: {problem}");
        assert_eq!(problem["field"], field, "{problem}");
        assert!(!problem["detail"].as_str().unwrap().is_empty());
    }
    let (status, problem) = acme
        .post(
            "/v1/endpoints",
            json!({"url": "https://x.example.com/", "colour": "red"}),
        )
        .await;
    assert!(status == 400 || status == 422, "{problem}");

    let (status, problem) = acme
        .post("/v1/events", json!({"type": "bad type!", "data": {}}))
        .await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("type")));
    let (status, problem) = acme
        .post(
            "/v1/events",
            json!({"type": "a.b", "data": {}, "id": "has.dot"}),
        )
        .await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("id")));
    let (status, _) = acme.post("/v1/events", json!({"type": "a.b"})).await;
    assert_eq!(status, 422, "data is required");

    let big = "x".repeat(300 * 1024);
    let (status, problem) = acme
        .post("/v1/events", json!({"type": "a.b", "data": {"blob": big}}))
        .await;
    assert_eq!(status, 413, "{problem}");
    let just_under = "x".repeat(255 * 1024);
    let (status, _) = acme
        .post("/v1/events", json!({"type": "a.b", "data": just_under}))
        .await;
    assert_eq!(status, 202, "a payload under 256 KiB is accepted whole");

    let garbage = acme
        .client
        .post(format!("{}/v1/events", server.base))
        .bearer_auth(&acme.key)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(garbage.status(), 400);
    // An encoded body is refused as such, whatever it holds: labelled gzip, a plain
    // one was taken, and a gzipped one was "not valid JSON".
    for (encoding, status) in [("gzip", 415), ("br, identity", 415), ("identity", 202)] {
        let answer = acme
            .client
            .post(format!("{}/v1/events", server.base))
            .bearer_auth(&acme.key)
            .header("content-type", "application/json")
            .header("content-encoding", encoding)
            .body(r#"{"type": "a.b", "data": {}}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), status, "{encoding}");
        if status == 415 {
            assert_eq!(answer.headers()["content-type"], "application/problem+json");
        }
    }

    for path in [
        "/v1/deliveries?status=lost",
        "/v1/deliveries?limit=0",
        "/v1/deliveries?since=yesterday",
        "/v1/deliveries?endpoint_id=nope",
    ] {
        let (status, problem) = acme.get(path).await;
        assert_eq!(status, 422, "{path}: {problem}");
    }
    for path in [
        "/v1/endpoints/ep_nope",
        "/v1/deliveries/dlv_x",
        "/v1/events/e.v",
        "/v1/nothing",
    ] {
        let (status, _) = acme.get(path).await;
        assert_eq!(status, 404, "{path}");
    }
    let (status, health) = acme.get("/healthz").await;
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));
}

/// A tenant's endpoints are bounded: each publish fans out to every one of them.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_has_at_most_a_hundred_endpoints() {
    let dir = TempDir::new("endpoint-cap");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let (_, other) = server.admin().tenant("Other").await;
    let mut ids = Vec::new();
    for n in 0..entrega_core::endpoint::MAX_ENDPOINTS_PER_TENANT {
        let ep = acme
            .endpoint(json!({"url": format!("https://hooks{n}.example.com/")}))
            .await;
        ids.push(ep["id"].as_str().unwrap().to_owned());
    }
    let (status, problem) = acme
        .post(
            "/v1/endpoints",
            json!({"url": "https://one-more.example.com/"}),
        )
        .await;
    assert_eq!(status, 409, "{problem}");
    assert!(
        problem["detail"].as_str().unwrap().contains("at most 100"),
        "{problem}"
    );
    // Creates racing at the limit: exactly enough of them stay.
    for id in ids.drain(..5) {
        let (status, _) = acme
            .call("DELETE", &format!("/v1/endpoints/{id}"), None)
            .await;
        assert_eq!(status, 204);
    }
    let racing = futures_util::future::join_all((0..20).map(|n| {
        acme.post(
            "/v1/endpoints",
            json!({"url": format!("https://racer{n}.example.com/")}),
        )
    }))
    .await;
    let created = racing.iter().filter(|(status, _)| *status == 201).count();
    assert!(racing.iter().all(|(status, _)| [201, 409].contains(status)));
    let (_, page) = acme.get("/v1/endpoints?limit=200").await;
    let count = page["data"].as_array().unwrap().len();
    let statuses: Vec<u16> = racing.iter().map(|(status, _)| *status).collect();
    assert_eq!((created, count), (5, 100), "{statuses:?}");
    for (status, body) in &racing {
        if *status == 201 {
            ids.push(body["id"].as_str().unwrap().to_owned());
        }
    }
    // Another tenant's count is its own, and a deleted endpoint makes room.
    other
        .endpoint(json!({"url": "https://theirs.example.com/"}))
        .await;
    let (status, _) = acme
        .call("DELETE", &format!("/v1/endpoints/{}", ids[0]), None)
        .await;
    assert_eq!(status, 204);
    acme.endpoint(json!({"url": "https://one-more.example.com/"}))
        .await;
}

/// A query parameter a list does not take, or one given twice, is a 400 naming it:
/// ignored, a misspelt filter answered 200 with every row, unfiltered, and of a
/// repeated one only the last counted (a hostile test).
#[tokio::test(flavor = "multi_thread")]
async fn unknown_and_repeated_query_parameters_are_refused() {
    let dir = TempDir::new("query-params");
    let server = Server::start(&dir);
    let admin = server.admin();
    let (tenant, acme) = admin.tenant("Acme").await;
    for (api, path, named) in [
        (&acme, "/v1/deliveries?statuss=failed".to_owned(), "statuss"),
        (&acme, "/v1/deliveries?bogus=1&limit=5".to_owned(), "bogus"),
        (
            &acme,
            "/v1/deliveries?status=delivered&status=failed".to_owned(),
            "status",
        ),
        (&acme, "/v1/failures?status=bogus".to_owned(), "status"),
        (&acme, "/v1/failures?since=notadate".to_owned(), "since"),
        (&acme, "/v1/endpoints?since=notadate".to_owned(), "since"),
        (&acme, "/v1/events/evt_1?x=1".to_owned(), "x"),
        (&admin, "/v1/tenants?name=Acme".to_owned(), "name"),
        (
            &admin,
            format!("/v1/endpoints?tenant_id={tenant}&tenant_id={tenant}"),
            "tenant_id",
        ),
    ] {
        let (status, problem) = api.get(&path).await;
        assert_eq!(status, 400, "{path}: {problem}");
        assert_eq!(problem["field"], named, "{path}: {problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains(named),
            "{path}: {problem}"
        );
    }
    // Routes that take no parameter refuse one too, before acting: `dry_run` published
    // a real event, and `rotate-secret?x=1` rotated the secret.
    let endpoint = acme
        .endpoint(json!({"url": "https://hooks.example.com/"}))
        .await;
    let ep = format!("/v1/endpoints/{}", endpoint["id"].as_str().unwrap());
    let (status, problem) = acme
        .post("/v1/events?dry_run=true", json!({"type": "q", "data": {}}))
        .await;
    assert_eq!((status, problem["field"].as_str()), (400, Some("dry_run")));
    let (status, problem) = acme
        .post(&format!("{ep}/rotate-secret?x=1"), json!({}))
        .await;
    assert_eq!((status, problem["field"].as_str()), (400, Some("x")));
    let (status, problem) = acme.get(&format!("{ep}?verbose=1")).await;
    assert_eq!((status, problem["field"].as_str()), (400, Some("verbose")));
    let (status, _) = acme.call("HEAD", "/v1/deliveries?bogus=1", None).await;
    assert_eq!(status, 400, "a HEAD is checked as its GET");
    // Without a valid key the answer is the 401, as for any other request: the 400
    // listed the route's parameters to anyone.
    let nobody = Api {
        key: "ent_wrong".into(),
        ..acme.clone()
    };
    let (status, problem) = nobody.get("/v1/deliveries?bogus=1").await;
    assert_eq!(status, 401, "{problem}");
    assert!(problem.get("field").is_none(), "{problem}");
    let raw = reqwest::get(format!("{}/v1/deliveries?bogus=1", server.base))
        .await
        .unwrap();
    assert_eq!(raw.status(), 401);
    let (_, now) = acme.get(&ep).await;
    assert_eq!(now["secret"], endpoint["secret"], "not rotated");
    let (_, page) = acme.get("/v1/deliveries").await;
    assert_eq!(page["data"], json!([]), "nothing published");
    // A tenant key naming another tenant is refused, as when it publishes (it got
    // its own list, or an empty one).
    let (other, _) = admin.tenant("Other").await;
    for path in ["/v1/deliveries", "/v1/failures", "/v1/endpoints"] {
        let (status, problem) = acme.get(&format!("{path}?tenant_id={other}")).await;
        assert_eq!(
            (status, problem["field"].as_str()),
            (422, Some("tenant_id")),
            "{path}"
        );
        let (status, _) = acme.get(&format!("{path}?tenant_id={tenant}")).await;
        assert_eq!(status, 200, "its own: {path}");
    }
    // A type no event can have is a misspelt filter, not an empty page.
    let (status, problem) = acme.get("/v1/deliveries?event_type=bad%20type!").await;
    assert_eq!(
        (status, problem["field"].as_str()),
        (422, Some("event_type"))
    );
    let window = serde_json::json!({"event_type": "bad type!", "since": "2026-01-01T00:00:00Z",
        "until": "2026-01-02T00:00:00Z"});
    let (status, problem) = acme.post("/v1/deliveries/resend", window).await;
    assert_eq!(
        (status, problem["field"].as_str()),
        (422, Some("event_type"))
    );
    // What the lists take is still taken.
    for path in [
        "/v1/deliveries?status=failed&limit=5&event_type=x".to_owned(),
        "/v1/failures?acknowledged=false&limit=5".to_owned(),
        "/v1/endpoints?limit=5".to_owned(),
    ] {
        let (status, answer) = acme.get(&path).await;
        assert_eq!(status, 200, "{path}: {answer}");
    }
    let (status, answer) = admin
        .get(&format!("/v1/deliveries?tenant_id={tenant}&limit=5"))
        .await;
    assert_eq!(status, 200, "{answer}");
}

/// A body field given twice is refused, naming it: the last one counted, so
/// `{"type":"a","data":{},"type":"b"}` published an event of type `b` (a hostile test).
#[tokio::test(flavor = "multi_thread")]
async fn a_body_field_given_twice_is_refused() {
    let dir = TempDir::new("twice");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    for (path, body, named) in [
        ("/v1/events", r#"{"type":"a","data":{},"type":"b"}"#, "type"),
        (
            "/v1/endpoints",
            r#"{"url":"https://a.example.com/","url":"https://b.example.com/"}"#,
            "url",
        ),
        // At any depth: `data` is kept as written (a receiver whose parser keeps the
        // first `x` read another event than the one compared and stored), and a map
        // kept the last.
        (
            "/v1/events",
            r#"{"type":"a","data":{"big":1e400,"o":[{"x":1,"x":2}]}}"#,
            "data.o[0].x",
        ),
        (
            "/v1/endpoints",
            r#"{"url":"https://a.example.com/","retry":{"delays_s":[1],"delays_s":[2]}}"#,
            "retry.delays_s",
        ),
    ] {
        let (status, problem) = acme.post_text(path, body.to_owned()).await;
        assert_eq!(
            (status, problem["field"].as_str()),
            (400, Some(named)),
            "{path}"
        );
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains("twice"), "{path}: {problem}");
    }
    // An array of a route's fields in order is not its object: it published an event.
    for (path, body) in [
        ("/v1/events", r#"["order.created",{"x":1}]"#),
        ("/v1/endpoints", r#"["https://a.example.com/"]"#),
    ] {
        let (status, problem) = acme.post_text(path, body.to_owned()).await;
        assert_eq!(status, 400, "{path}: {problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains("JSON object"),
            "{path}: {problem}"
        );
    }
    let (status, page) = acme.get("/v1/endpoints").await;
    assert_eq!((status, page["data"].as_array().unwrap().len()), (200, 0));
    let (status, page) = acme.get("/v1/deliveries").await;
    assert_eq!((status, page["data"].as_array().unwrap().len()), (200, 0));
    // The same key in two objects is no duplicate.
    let (status, event) = acme
        .post_text(
            "/v1/events",
            r#"{"type":"a","data":{"x":{"x":1},"y":[{"x":1},{"x":2}]}}"#.to_owned(),
        )
        .await;
    assert_eq!(status, 202, "{event}");
}

/// A route that takes no body takes nothing, or `{}`: a field is a 422 naming it and
/// anything else a 400, before the route acts. `{"secret": …}` to `rotate-secret`
/// answered 200 with a secret of the server's choosing (a hostile test).
#[tokio::test(flavor = "multi_thread")]
async fn a_route_that_takes_no_body_refuses_one() {
    let dir = TempDir::new("no-body");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let endpoint = acme
        .endpoint(json!({"url": "https://hooks.example.com/", "disabled": true}))
        .await;
    let rotate = format!(
        "/v1/endpoints/{}/rotate-secret",
        endpoint["id"].as_str().unwrap()
    );
    let secret_now = || async {
        let (_, now) = acme
            .get(&format!(
                "/v1/endpoints/{}",
                endpoint["id"].as_str().unwrap()
            ))
            .await;
        now["secret"].clone()
    };
    let chosen = json!({"secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"});
    let (status, problem) = acme.post(&rotate, chosen).await;
    assert_eq!(
        (status, problem["field"].as_str()),
        (422, Some("secret")),
        "{problem}"
    );
    for body in ["rotate please", "[]", "null", "{} {}"] {
        let (status, problem) = acme.post_text(&rotate, body.to_owned()).await;
        assert_eq!(status, 400, "{body}: {problem}");
    }
    assert_eq!(secret_now().await, endpoint["secret"], "not rotated");
    let (status, rotated) = acme.call("POST", &rotate, None).await;
    assert_eq!(status, 200, "no body: {rotated}");
    assert_ne!(rotated["secret"], endpoint["secret"]);
    let (status, again) = acme.post_text(&rotate, " { } ".to_owned()).await;
    assert_eq!(status, 200, "`{{}}`: {again}");
    assert_ne!(again["secret"], rotated["secret"]);

    // The resend buttons: the body is checked before the record is looked up.
    for path in [
        format!("/v1/deliveries/dlv_{}/resend", "0".repeat(32)),
        format!("/v1/failures/fail_{}/resend", "0".repeat(32)),
    ] {
        let (status, problem) = acme.post(&path, json!({"at": "later"})).await;
        assert_eq!(
            (status, problem["field"].as_str()),
            (422, Some("at")),
            "{path}"
        );
        let (status, problem) = acme.post(&path, json!({})).await;
        assert_eq!(status, 404, "{path}: {problem}");
        let (status, problem) = acme.call("POST", &path, None).await;
        assert_eq!(status, 404, "{path}: {problem}");
    }
}
