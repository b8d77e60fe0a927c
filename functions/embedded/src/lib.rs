//! The embedded runtime: Entrega on one machine. SQLite adapters implement the core's
//! ports, pollers play the parts Lambda's event source mappings play on AWS, and the
//! `entrega` binary wires it all to the shared API router.

mod arriving_body;
pub mod cli;
pub mod db_lock;
pub mod fan_out;
pub mod http_server;
pub mod lane_slots;
pub mod listen;
pub mod metrics;
pub mod notifier;
pub mod pg_outbox;
pub mod restart;
pub mod runtime;
pub mod serve;
pub mod slow_attempts;
pub mod sqlite;

#[cfg(test)]
mod test_support;
