//! HTTP for both runtimes: the delivery transport (reqwest, the SSRF guard) and the
//! API router (axum) with its support console, which `entrega serve` and the API
//! Lambda both mount.

pub mod api;
pub mod console;
pub mod transport;
