//! Lambda: the DLQ analyzer (SQS trigger on the failures queue, and a schedule that
//! runs the 24-hour rule).
use std::sync::Arc;

use entrega_aws::function::cold_start;
use entrega_aws::lambda::analyzer_event;
use entrega_http::transport::{HttpTransport, TargetPolicy};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let services = cold_start(Arc::new(HttpTransport::new(TargetPolicy::from_env()?))).await?;
    run(service_fn(|event: LambdaEvent<Value>| async {
        Ok::<_, Error>(analyzer_event(&services, event.payload).await)
    }))
    .await
}
