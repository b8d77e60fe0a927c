//! The embedded runtime's metrics, served at `GET /metrics` in Prometheus text format:
//! attempts, successes and failures by kind per tenant and endpoint, response time and
//! publish-to-delivered latency (summed and counted, so rates and means come out of
//! PromQL), failures per tenant, and the age of the oldest unacknowledged failure.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

use entrega_core::ids::TenantId;
use entrega_core::ports::{AttemptMetric, Metrics};

#[derive(Default)]
struct Registry {
    /// (tenant, endpoint, outcome) → attempts
    attempts: BTreeMap<(String, String, String), u64>,
    /// (tenant, endpoint) → (sum of response ms, count)
    response_ms: BTreeMap<(String, String), (u64, u64)>,
    /// (tenant, endpoint) → (sum of publish→delivered ms, count)
    latency_ms: BTreeMap<(String, String), (u64, u64)>,
    failures: BTreeMap<String, u64>,
    oldest_unacknowledged_s: Option<u64>,
}

#[derive(Default)]
pub struct PrometheusMetrics {
    registry: Mutex<Registry>,
}

impl Metrics for PrometheusMetrics {
    fn attempt(&self, m: &AttemptMetric) {
        let mut r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        let key = (m.tenant_id.to_string(), m.endpoint_id.to_string());
        let outcome = m.failure.map_or("success", |k| k.as_str()).to_owned();
        *r.attempts
            .entry((key.0.clone(), key.1.clone(), outcome))
            .or_default() += 1;
        let rt = r.response_ms.entry(key.clone()).or_default();
        *rt = (rt.0 + m.response_ms, rt.1 + 1);
        if let Some(latency) = m.delivery_latency_ms {
            let l = r.latency_ms.entry(key).or_default();
            *l = (l.0 + latency, l.1 + 1);
        }
    }

    fn failure(&self, tenant: &TenantId) {
        let mut r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        *r.failures.entry(tenant.to_string()).or_default() += 1;
    }

    fn oldest_unacknowledged_failure(&self, age: Option<Duration>) {
        let mut r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        r.oldest_unacknowledged_s = age.map(|a| a.as_secs());
    }
}

impl PrometheusMetrics {
    /// The exposition text.
    pub fn render(&self) -> String {
        let r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        let _ = writeln!(out, "# HELP entrega_attempts_total Delivery attempts by outcome.\n# TYPE entrega_attempts_total counter");
        for ((t, e, o), n) in &r.attempts {
            let _ = writeln!(
                out,
                "entrega_attempts_total{{tenant=\"{t}\",endpoint=\"{e}\",outcome=\"{o}\"}} {n}"
            );
        }
        for (name, help, map) in [
            (
                "entrega_response_ms",
                "Receiver response time.",
                &r.response_ms,
            ),
            (
                "entrega_delivery_latency_ms",
                "Publish to delivered.",
                &r.latency_ms,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} summary");
            for ((t, e), (sum, count)) in map {
                let _ = writeln!(out, "{name}_sum{{tenant=\"{t}\",endpoint=\"{e}\"}} {sum}");
                let _ = writeln!(
                    out,
                    "{name}_count{{tenant=\"{t}\",endpoint=\"{e}\"}} {count}"
                );
            }
        }
        let _ = writeln!(out, "# HELP entrega_failures_total Deliveries moved to failures.\n# TYPE entrega_failures_total counter");
        for (t, n) in &r.failures {
            let _ = writeln!(out, "entrega_failures_total{{tenant=\"{t}\"}} {n}");
        }
        let _ = writeln!(out, "# HELP entrega_oldest_unacknowledged_failure_age_seconds Age of the oldest unacknowledged failure (0: none).\n# TYPE entrega_oldest_unacknowledged_failure_age_seconds gauge");
        let _ = writeln!(
            out,
            "entrega_oldest_unacknowledged_failure_age_seconds {}",
            r.oldest_unacknowledged_s.unwrap_or(0)
        );
        out
    }
}
