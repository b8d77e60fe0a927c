//! Metrics from the Lambda functions in CloudWatch Embedded Metric Format: one JSON line
//! per measurement on stdout, which CloudWatch Logs turns into metrics — no API call, no
//! latency on the delivery path. Namespace `Entrega`; dimensions per tenant and per
//! tenant and endpoint.

use std::time::Duration;

use entrega_core::ids::TenantId;
use entrega_core::ports::{AttemptMetric, Metrics};
use serde_json::{json, Value};

/// The CloudWatch namespace of every Entrega metric (the dashboard and alarms use it).
pub const NAMESPACE: &str = "Entrega";

pub struct EmfMetrics;

/// One EMF document: `values` are (metric name, unit, value).
pub fn document(dimensions: &[&[&str]], properties: Value, values: &[(&str, &str, f64)]) -> Value {
    let mut doc = json!({
        "_aws": {
            "Timestamp": chrono::Utc::now().timestamp_millis(),
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": dimensions,
                "Metrics": values.iter().map(|(name, unit, _)| json!({ "Name": name, "Unit": unit })).collect::<Vec<_>>(),
            }],
        },
    });
    if let (Some(doc), Some(props)) = (doc.as_object_mut(), properties.as_object()) {
        doc.extend(props.clone());
        for (name, _, value) in values {
            doc.insert((*name).to_owned(), json!(value));
        }
    }
    doc
}

impl Metrics for EmfMetrics {
    fn attempt(&self, m: &AttemptMetric) {
        let outcome = m.failure.map_or("success", |k| k.as_str());
        let mut values = vec![
            ("Attempts", "Count", 1.0),
            (
                "Successes",
                "Count",
                if m.failure.is_none() { 1.0 } else { 0.0 },
            ),
            (
                "Failures",
                "Count",
                if m.failure.is_some() { 1.0 } else { 0.0 },
            ),
            ("ResponseTime", "Milliseconds", m.response_ms as f64),
        ];
        if let Some(latency) = m.delivery_latency_ms {
            values.push(("DeliveryLatency", "Milliseconds", latency as f64));
        }
        let doc = document(
            // Per tenant, per endpoint, and by outcome (failures by kind).
            &[
                &["TenantId"],
                &["TenantId", "EndpointId"],
                &["Outcome"],
                &[],
            ],
            json!({ "TenantId": m.tenant_id, "EndpointId": m.endpoint_id, "Outcome": outcome }),
            &values,
        );
        println!("{doc}");
    }

    fn failure(&self, tenant: &TenantId) {
        let doc = document(
            &[&["TenantId"], &[]],
            json!({ "TenantId": tenant }),
            &[("DeadLettered", "Count", 1.0)],
        );
        println!("{doc}");
    }

    fn oldest_unacknowledged_failure(&self, age: Option<Duration>) {
        let seconds = age.map_or(0.0, |a| a.as_secs_f64());
        let doc = document(
            &[&[]],
            json!({}),
            &[("OldestUnacknowledgedFailureAge", "Seconds", seconds)],
        );
        println!("{doc}");
    }

    fn outbox_item_refused(&self) {
        let doc = document(&[&[]], json!({}), &[("MalformedOutboxItems", "Count", 1.0)]);
        println!("{doc}");
    }

    fn sweep_preparation_failed(&self) {
        let doc = document(
            &[&[]],
            json!({}),
            &[("SweepPreparationFailed", "Count", 1.0)],
        );
        println!("{doc}");
    }

    fn deliveries_swept(&self, count: u64) {
        let doc = document(
            &[&[]],
            json!({}),
            &[("DeliveriesSwept", "Count", count as f64)],
        );
        println!("{doc}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_follow_the_embedded_metric_format() {
        let doc = document(
            &[&["TenantId"]],
            json!({ "TenantId": "ten_1" }),
            &[("Attempts", "Count", 1.0)],
        );
        let spec = &doc["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(spec["Namespace"], NAMESPACE);
        assert_eq!(spec["Dimensions"], json!([["TenantId"]]));
        assert_eq!(
            spec["Metrics"][0],
            json!({ "Name": "Attempts", "Unit": "Count" })
        );
        assert_eq!(doc["Attempts"], 1.0);
        assert_eq!(doc["TenantId"], "ten_1");
        assert!(doc["_aws"]["Timestamp"].as_i64().unwrap() > 0);
    }
}
