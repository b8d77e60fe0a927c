//! The producer's transactional outbox in its own PostgreSQL (`entrega serve --outbox
//! postgres://…`). The producer inserts one row into `entrega_outbox` in the same
//! transaction as its business write; a rolled-back transaction leaves no row, so no
//! event. Entrega drains the table into its own store and fan-out.
//!
//! The table contract (version [`schema::CONTRACT_VERSION`], created by `entrega outbox
//! init`) is in [`schema`]; the drain, safe with several drains and after crashes, is
//! in [`drain`].

pub mod drain;
pub mod schema;
pub mod tls;

pub use drain::{Drain, DrainError};

/// How the logs and `/healthz` name an outbox: host, port and database, never the
/// password that may be in its URL.
pub fn describe(config: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config
        .get_dbname()
        .or(config.get_user())
        .unwrap_or("postgres");
    format!("postgres {host}:{port}/{db}")
}

/// A PostgreSQL error with the server's message and its causes (the client's own
/// `Display` says only "db error" or "error performing TLS handshake").
pub fn error_text(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{}: {}", db.severity(), db.message());
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text += &format!(": {c}");
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_outbox_is_described_without_its_password() {
        let config: tokio_postgres::Config = "postgres://app:s3cret@db.internal:6543/crm"
            .parse()
            .unwrap();
        let described = super::describe(&config);
        assert_eq!(described, "postgres db.internal:6543/crm");
        assert!(!described.contains("s3cret"));
    }
}
