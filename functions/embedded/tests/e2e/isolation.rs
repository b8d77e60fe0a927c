//! Tenant isolation: another tenant's resources do not exist for you (404).

use std::time::Duration;

use serde_json::json;

use crate::harness::*;

#[tokio::test(flavor = "multi_thread")]
async fn tenant_b_cannot_see_or_change_tenant_a() {
    let dir = TempDir::new("isolation");
    let server = Server::start(&dir);
    let (a_id, a) = server.admin().tenant("A").await;
    let (_, b) = server.admin().tenant("B").await;
    let receiver = Receiver::answering(200).await;
    let ep = a.endpoint(json!({"url": receiver.url("/")})).await;
    let ep_id = ep["id"].as_str().unwrap();
    let evt = a.publish("a.b", json!({"secret": "of A"})).await;
    let dlv = eventually(Duration::from_secs(5), "delivery", || async {
        a.deliveries_of(&evt)
            .await
            .first()
            .map(|d| d["id"].as_str().unwrap().to_owned())
    })
    .await;

    for (method, path, body) in [
        ("GET", format!("/v1/endpoints/{ep_id}"), None),
        (
            "PATCH",
            format!("/v1/endpoints/{ep_id}"),
            Some(json!({"url": "https://evil.example.com/"})),
        ),
        ("POST", format!("/v1/endpoints/{ep_id}/rotate-secret"), None),
        ("DELETE", format!("/v1/endpoints/{ep_id}"), None),
        ("GET", format!("/v1/events/{evt}"), None),
        ("GET", format!("/v1/deliveries/{dlv}"), None),
    ] {
        let (status, problem) = b.call(method, &path, body).await;
        assert_eq!(status, 404, "{method} {path}: {problem}");
    }
    let (_, list) = b.get("/v1/endpoints").await;
    assert!(list["data"].as_array().unwrap().is_empty());
    let (status, problem) = b.get(&format!("/v1/deliveries?tenant_id={a_id}")).await;
    assert_eq!(
        (status, problem["field"].as_str()),
        (422, Some("tenant_id")),
        "a tenant key names no other tenant: {problem}"
    );
    let (status, _) = b
        .post(
            "/v1/events",
            json!({"type": "a.b", "data": {}, "tenant_id": a_id}),
        )
        .await;
    assert_eq!(
        status, 422,
        "a tenant key cannot publish for another tenant"
    );
    // Event ids are scoped to their tenant: B's use of A's id is B's own event, and
    // answers exactly as any new id would (no oracle of A's ids).
    let (status, body) = b
        .post(
            "/v1/events",
            json!({"type": "a.b", "data": {"of": "B"}, "id": evt}),
        )
        .await;
    assert_eq!(status, 202, "B's own event with the same id: {body}");
    let (status, body) = b.get(&format!("/v1/events/{evt}")).await;
    assert_eq!(status, 200);
    assert_eq!(body["data"], json!({"of": "B"}));
    let (_, body) = a.get(&format!("/v1/events/{evt}")).await;
    assert_eq!(
        body["data"],
        json!({"secret": "of A"}),
        "A's event is untouched"
    );
    let (status, _) = b
        .post(
            "/v1/tenants",
            json!({"name": "C", "owner_email": "c@example.com"}),
        )
        .await;
    assert_eq!(status, 403, "only admin creates tenants");

    // A still owns everything, unchanged.
    let (status, still) = a.get(&format!("/v1/endpoints/{ep_id}")).await;
    assert_eq!((status, &still["url"]), (200, &ep["url"]));
    assert_eq!(still["secret"], ep["secret"]);
    // And the admin sees across tenants.
    let (status, _) = server.admin().get(&format!("/v1/deliveries/{dlv}")).await;
    assert_eq!(status, 200);
}

/// The admin lists tenants a page at a time; a tenant reads only itself, and another
/// tenant's id is a 404, as for every resource.
#[tokio::test(flavor = "multi_thread")]
async fn tenants_are_listed_by_admin_and_read_by_themselves() {
    let dir = TempDir::new("tenants");
    let server = Server::start(&dir);
    let admin = server.admin();
    let (a, acme) = admin.tenant("Acme").await;
    let (b, _) = admin.tenant("Beta").await;
    let (c, _) = admin.tenant("Gamma").await;

    let (status, first) = admin.get("/v1/tenants?limit=2").await;
    assert_eq!(status, 200, "{first}");
    let ids: Vec<&str> = first["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [c.as_str(), b.as_str()], "newest first");
    let cursor = first["next_cursor"].as_str().unwrap();
    let (_, rest) = admin
        .get(&format!("/v1/tenants?limit=2&cursor={cursor}"))
        .await;
    assert_eq!(rest["data"][0]["id"], a.as_str());
    assert_eq!(rest["data"][0]["name"], "Acme");
    assert!(rest["next_cursor"].is_null());
    assert!(
        rest["data"][0].get("api_key").is_none(),
        "keys are never listed"
    );

    assert_eq!(acme.get("/v1/tenants").await.0, 403, "admin only");
    let (status, own) = acme.get(&format!("/v1/tenants/{a}")).await;
    assert_eq!(
        (status, own["owner_email"].as_str()),
        (200, Some("owner@example.com"))
    );
    assert_eq!(acme.get(&format!("/v1/tenants/{b}")).await.0, 404);
    assert_eq!(admin.get(&format!("/v1/tenants/{b}")).await.0, 200);
    assert_eq!(admin.get("/v1/tenants/ten_nope").await.0, 404);
    let (status, bad) = admin.get("/v1/tenants?cursor=ep_x").await;
    assert_eq!(status, 400, "{bad}");
    for name in ["bad\u{1b}[31mred", "a\u{202E}b", "a\nb", "a\u{0}b"] {
        let (status, body) = admin
            .post(
                "/v1/tenants",
                serde_json::json!({"name": name, "owner_email": "o@x.example"}),
            )
            .await;
        assert_eq!(status, 422, "{name:?}: {body}");
        assert!(body["detail"].as_str().unwrap().contains("name"), "{body}");
    }
    let (status, _) = admin
        .post(
            "/v1/tenants",
            serde_json::json!({"name": "é".repeat(200), "owner_email": "o@x.example"}),
        )
        .await;
    assert_eq!(status, 201, "200 characters, not bytes");
}
