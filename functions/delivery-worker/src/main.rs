//! Lambda: the delivery worker (SQS trigger on the delivery queue).
use std::sync::Arc;

use entrega_aws::aws_lambda_events::event::sqs::SqsEvent;
use entrega_aws::lambda::delivery_batch;
use entrega_http::transport::{HttpTransport, TargetPolicy};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let transport = Arc::new(HttpTransport::new(TargetPolicy::from_env()?));
    let services = entrega_aws::function::cold_start(transport).await?;
    run(service_fn(|event: LambdaEvent<SqsEvent>| async {
        Ok::<_, Error>(delivery_batch(&services, event.payload).await)
    }))
    .await
}
