//! TLS to the producer's database, on the same rustls (ring) stack as the delivery
//! transport. `sslmode` in the URL decides: `disable` never, `prefer` (the default)
//! when the server offers it, `require` always. The server's certificate is always
//! verified, against the system's roots or the bundle named by `SSL_CERT_FILE`: an
//! outbox URL carries credentials, and an unverified TLS connection would hand them
//! to whoever answers.

use std::sync::Arc;

use tokio_postgres_rustls::MakeRustlsConnect;

/// The connector every outbox connection uses. Without any trusted root (a bare
/// container), TLS connections fail verification and say so; plaintext ones
/// (`sslmode=disable`, or `prefer` to a server without TLS) still work.
pub fn connector() -> MakeRustlsConnect {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        // One unreadable system certificate must not take TLS away from the rest.
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        tracing::warn!(
            errors = ?native.errors,
            "no trusted root certificates for outbox TLS; set SSL_CERT_FILE to a PEM bundle"
        );
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("ring supports the default TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    MakeRustlsConnect::new(config)
}
