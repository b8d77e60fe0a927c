//! Lambda: the DLQ analyzer (SQS trigger on the failures queue).
use std::sync::Arc;

use entrega_aws::aws_lambda_events::event::sqs::SqsEvent;
use entrega_aws::function::{alert_threshold, cold_start};
use entrega_aws::lambda::failure_batch;
use entrega_http::transport::{HttpTransport, TargetPolicy};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let services = cold_start(Arc::new(HttpTransport::new(TargetPolicy::from_env()?))).await?;
    let threshold = alert_threshold();
    run(service_fn(|event: LambdaEvent<SqsEvent>| async {
        Ok::<_, Error>(failure_batch(&services, event.payload, threshold).await)
    }))
    .await
}
