//! End to end over real sockets: the `entrega` binary, real receivers on loopback.

mod api_errors;
mod aws_backend;
mod crash;
mod delivery;
mod fairness;
mod harness;
mod isolation;
mod retries;
mod ssrf;
