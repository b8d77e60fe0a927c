//! Entrega's domain core: typed ids, events, endpoints, deliveries, retry policies,
//! outcome classification, Standard Webhooks signatures, the delivery state machine,
//! the ports the runtimes implement, and the handlers both runtimes run.
//!
//! Nothing here does I/O: no AWS, no SQLite, no HTTP client. Adapters live in the
//! `entrega-embedded`, `entrega-http` and (later) AWS crates.

pub mod conditions;
pub mod delivery;
pub mod endpoint;
pub mod endpoint_health;
pub mod event;
pub mod failure;
pub mod handlers;
pub mod hex;
pub mod ids;
pub mod json_keys;
pub mod memory;
pub mod outcome;
pub mod ports;
pub mod producer_outbox;
pub mod raw_json;
pub mod remembered;
pub mod retry;
pub mod retry_after;
pub mod signature;
pub mod slots;
pub mod state_machine;
pub mod tenant;
pub mod text;
