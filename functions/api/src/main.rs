//! Lambda: the HTTP API (API Gateway HTTP API), the same router as `entrega serve`.
use std::sync::Arc;

use entrega_http::api::rate_limit::{rate_limit_from_env, RateLimiter};
use entrega_http::api::{router, App};
use entrega_http::transport::{HttpTransport, TargetPolicy};
use lambda_http::{run, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let targets = TargetPolicy::from_env()?;
    let transport = Arc::new(HttpTransport::new(targets.clone()));
    let services = entrega_aws::function::cold_start(transport).await?;
    let limiter = Some(Arc::new(RateLimiter::new(rate_limit_from_env())));
    run(router(App {
        services,
        targets: Arc::new(targets),
        limiter,
        conditions: Default::default(),
        waiting: None,
        publisher: None,
    }))
    .await
}
