//! Lambda: the outbox trigger (DynamoDB stream of the outbox table, INSERTs only).
use std::sync::Arc;

use entrega_aws::aws_lambda_events::event::dynamodb::Event;
use entrega_aws::lambda::{outbox_batch, outbox_records};
use entrega_http::transport::{HttpTransport, TargetPolicy};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let transport = Arc::new(HttpTransport::new(TargetPolicy::from_env()?));
    let (services, quarantine) = entrega_aws::function::outbox_trigger_start(transport).await?;
    run(service_fn(|event: LambdaEvent<Event>| async {
        let records = outbox_records(event.payload);
        Ok::<_, Error>(outbox_batch(&services, &quarantine, records).await)
    }))
    .await
}
