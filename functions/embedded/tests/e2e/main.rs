//! End to end over real sockets: the `entrega` binary, real receivers on loopback.

mod age_rule;
mod api_errors;
#[cfg(feature = "aws")]
mod aws_backend;
mod batch_resend;
mod cli;
mod console;
mod crash;
mod delivery;
mod fairness;
mod fuzz;
mod harness;
mod hostile;
mod hostile_connections;
mod hostile_db_file;
mod hostile_input;
mod isolation;
mod listen;
mod load;
mod openapi;
mod operations;
mod pg_outbox;
mod pg_outbox_connection;
mod pg_outbox_contract;
mod readme;
mod retries;
mod ssrf;
mod support_tools;
