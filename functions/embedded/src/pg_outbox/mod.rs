//! The producer's transactional outbox in its own PostgreSQL (`entrega serve --outbox
//! postgres://…`). The producer inserts one row into `entrega_outbox` in the same
//! transaction as its business write; a rolled-back transaction leaves no row, so no
//! event. Entrega drains the table into its own store and fan-out.
//!
//! The table contract (version [`schema::CONTRACT_VERSION`], created by `entrega outbox
//! init`) is in [`schema`]; the drain, safe with several drains and after crashes, is
//! in [`drain`].

pub mod drain;
mod row_key;
pub mod schema;
pub mod tls;

pub use drain::{Drain, DrainError};

use std::time::Duration;

use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Connection, Socket};

/// How long connecting to a producer's database may take, all of it: the TCP connect,
/// TLS and the start-up exchange. (The driver's own timeout covers only the TCP
/// connect: a server, or a proxy, that accepts and never answers held a drain there
/// for good, with `/healthz` saying all was well.)
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `entrega outbox init` may take once connected: it may wait for another
/// `init`, or for producers' transactions while it re-keys an older table.
pub const INIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Connect to `config` within [`CONNECT_TIMEOUT`], as `application_name`.
pub async fn connect<T>(
    config: &tokio_postgres::Config,
    tls: T,
    application_name: &str,
) -> Result<(Client, Connection<Socket, T::Stream>), String>
where
    T: MakeTlsConnect<Socket>,
{
    let mut config = config.clone();
    config.connect_timeout(CONNECT_TIMEOUT);
    config.application_name(application_name);
    match tokio::time::timeout(CONNECT_TIMEOUT, config.connect(tls)).await {
        Ok(connected) => connected.map_err(|e| error_text(&e)),
        Err(_) => Err(format!(
            "no answer from the database within {CONNECT_TIMEOUT:?} of connecting"
        )),
    }
}

/// `entrega outbox init`: create (or bring up to date) the outbox table, grant
/// `grant_to` what a drain needs, and check the table is one a drain can read; what
/// to print.
pub async fn init_command(
    config: &tokio_postgres::Config,
    grant_to: Option<&str>,
) -> Result<String, String> {
    let (mut client, connection) = connect(config, tls::connector(), "entrega-outbox-init").await?;
    tokio::spawn(connection);
    let made = schema::init(&mut client, grant_to);
    match tokio::time::timeout(INIT_TIMEOUT, made).await {
        Ok(made) => made?,
        Err(_) => {
            return Err(format!(
                "the database did not finish within {INIT_TIMEOUT:?}"
            ))
        }
    }
    Ok(format!("entrega_outbox ready in {}", describe(config)))
}

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

/// How `/healthz` and the log name each of `outboxes` ([`describe`]), told apart by
/// their place among those described alike (`#2`): two drains of one database (two
/// roles, or one URL twice) shared one health record, and each one's success cleared
/// the other's failure.
pub fn names(outboxes: &[tokio_postgres::Config]) -> Vec<String> {
    let described: Vec<String> = outboxes.iter().map(describe).collect();
    described
        .iter()
        .enumerate()
        .map(|(i, name)| {
            if described.iter().filter(|d| *d == name).count() == 1 {
                return name.clone();
            }
            let place = described[..=i].iter().filter(|d| *d == name).count();
            format!("{name} #{place}")
        })
        .collect()
}

/// A PostgreSQL error with the server's message and its causes (the client's own
/// `Display` says only "db error" or "error performing TLS handshake").
pub fn error_text(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{}: {}", db.severity(), db.message());
    }
    entrega_core::text::with_causes(e)
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

    #[test]
    fn outboxes_described_alike_are_told_apart() {
        let parse = |url: &str| url.parse::<tokio_postgres::Config>().unwrap();
        let names = super::names(&[
            parse("postgres://a@db:5432/crm"),
            parse("postgres://b@db:5432/crm"),
            parse("postgres://a@db:5432/billing"),
        ]);
        assert_eq!(
            names,
            [
                "postgres db:5432/crm #1",
                "postgres db:5432/crm #2",
                "postgres db:5432/billing"
            ]
        );
    }
}
