//! HTTP for both runtimes: the delivery transport (reqwest, the SSRF guard) and the
//! API router (axum) that `entrega serve` and the API Lambda both mount.

pub mod api;
pub mod transport;
