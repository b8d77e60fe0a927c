//! In-memory adapters of the ports, beside the real ones: small enough to be
//! obviously correct, for handler tests and deterministic simulations (time comes
//! from the [`crate::ports::Clock`] they are given, so a `ManualClock` drives them).
//! Every adapter here passes the same conformance suite as the SQLite and AWS ones.

mod edges;
mod log;
mod queue;
mod store;

pub use edges::{response, RecordingNotifier, ScriptedTransport, World};
pub use queue::MemoryQueue;
pub use store::MemoryStore;
