//! Entrega on AWS: adapters that implement the core's ports over DynamoDB, SQS,
//! EventBridge Scheduler and SNS; the event glue the Lambda functions share; the
//! producer contract (the outbox item); provisioning; and the pollers that let
//! `entrega serve --backend aws` play Lambda's event source mappings locally.

pub mod batch_buffers;
pub mod dynamo;
pub mod emf;
pub mod emulation;
pub mod function;
pub mod lambda;
pub mod outbox;
pub mod provision;
pub mod resources;
pub mod scheduler;
pub mod sns;
pub mod sqs;
pub mod stream_checkpoints;

/// The Lambda event types, for the function binaries.
pub use aws_lambda_events;
