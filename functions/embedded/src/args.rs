//! The `entrega serve`, `listen` and storage arguments: one typed configuration,
//! parsed once by clap from flags and environment alike, then handed to the library's
//! `ServeConfig`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use clap::ValueEnum;
use entrega_embedded::serve::Backend;
use ipnet::IpNet;

/// The retention period unless one is given: the AWS stack's default too.
const DEFAULT_RETENTION_DAYS: u32 = 30;
/// The longest retention period accepted (a century): past it, 0 says "forever".
const MAX_RETENTION_DAYS: i64 = 36_500;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BackendKind {
    Sqlite,
    Aws,
}

#[derive(clap::Args)]
pub(crate) struct StorageArgs {
    /// Where the data lives.
    #[arg(long, env = "ENTREGA_BACKEND", value_enum, default_value = "sqlite")]
    pub(crate) backend: BackendKind,
    /// The SQLite database file (`serve` creates it if missing; `admin-key` needs it).
    #[arg(long, env = "ENTREGA_DB", default_value = "./entrega.db")]
    pub(crate) db: PathBuf,
    /// How SQLite commits are made durable: `full` (each commit on disk before it is
    /// confirmed; an accepted event survives a power loss) or `normal` (survives a
    /// crash of the process, not of the machine; faster on slow disks).
    #[arg(long, env = "ENTREGA_DURABILITY", value_enum, default_value = "full")]
    pub(crate) durability: entrega_embedded::sqlite::Durability,
    /// Name prefix of the AWS resources (a deployed stack's name).
    #[arg(long, env = "ENTREGA_AWS_PREFIX", default_value = "entrega")]
    pub(crate) aws_prefix: String,
}

impl StorageArgs {
    pub(crate) fn backend(&self) -> Backend {
        match self.backend {
            BackendKind::Sqlite => Backend::Sqlite {
                db: self.db.clone(),
                durability: self.durability,
            },
            BackendKind::Aws => Backend::Aws {
                prefix: self.aws_prefix.clone(),
            },
        }
    }
}

#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub(crate) storage: StorageArgs,
    /// Address the API listens on.
    #[arg(long, env = "ENTREGA_LISTEN", default_value = "127.0.0.1:8787")]
    pub(crate) listen: SocketAddr,
    /// Days a settled delivery with its attempts, an event none of whose deliveries is
    /// left, and a failure record are kept before the SQLite store deletes them (on
    /// AWS, the stack's `RetentionDays` does this through DynamoDB's TTL); 0 keeps
    /// everything. Deliveries still waiting or paused are never deleted.
    #[arg(long, env = "ENTREGA_RETENTION_DAYS", default_value_t = DEFAULT_RETENTION_DAYS, value_parser = clap::value_parser!(u32).range(0..=MAX_RETENTION_DAYS))]
    pub(crate) retention_days: u32,
    /// Let deliveries reach this otherwise forbidden range (CIDR or single address),
    /// e.g. 127.0.0.0/8 for receivers on this machine. Repeatable.
    #[arg(long = "allow-target", env = "ENTREGA_ALLOW_TARGETS", value_delimiter = ',', value_parser = parse_range)]
    pub(crate) allow_targets: Vec<IpNet>,
    /// Permit http:// targets (otherwise https only).
    #[arg(long, env = "ENTREGA_ALLOW_HTTP", value_parser = clap::builder::BoolishValueParser::new(), default_value_t = false, num_args = 0, default_missing_value = "true")]
    pub(crate) allow_http: bool,
    /// The admin API key; when unset, one is generated at first start and printed once.
    #[arg(long, env = "ENTREGA_ADMIN_KEY", hide_env_values = true)]
    pub(crate) admin_key: Option<String>,
    /// Failures per tenant per hour above which an alert is raised.
    #[arg(long, env = "ENTREGA_ALERT_THRESHOLD", default_value_t = entrega_core::handlers::failures::DEFAULT_ALERT_THRESHOLD)]
    pub(crate) alert_threshold: u64,
    /// Where on-call alerts are POSTed (signed JSON); unset: they are logged.
    #[arg(long, env = "ENTREGA_ALERT_WEBHOOK", requires = "alert_webhook_secret")]
    pub(crate) alert_webhook: Option<String>,
    /// The `whsec_…` secret alert webhooks are signed with.
    #[arg(long, env = "ENTREGA_ALERT_WEBHOOK_SECRET", hide_env_values = true)]
    pub(crate) alert_webhook_secret: Option<entrega_core::signature::Secret>,
    /// SMTP server for owner notices, e.g. `smtp://user:pass@mail.example.com:587?tls=required`;
    /// unset: owner notices are logged.
    #[arg(
        long,
        env = "ENTREGA_SMTP_URL",
        hide_env_values = true,
        requires = "smtp_from"
    )]
    pub(crate) smtp_url: Option<String>,
    /// The sender of owner notices, e.g. `Entrega <notices@example.com>`.
    #[arg(long, env = "ENTREGA_SMTP_FROM")]
    pub(crate) smtp_from: Option<lettre::message::Mailbox>,
    /// Days of failing every attempt after which an endpoint is disabled.
    #[arg(long, env = "ENTREGA_UNHEALTHY_AFTER_DAYS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) unhealthy_after_days: u64,
    /// API requests per second per key (token bucket; the burst is twice this).
    #[arg(long, env = "ENTREGA_API_RATE_LIMIT", default_value_t = entrega_http::api::rate_limit::DEFAULT_RATE_PER_SECOND, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) api_rate_limit: u32,
    /// Waiting deliveries per tenant past which `POST /v1/events` answers 429 with
    /// `Retry-After` (backpressure before the disk fills), e.g. 100000.
    #[arg(long, env = "ENTREGA_MAX_BACKLOG", default_value_t = entrega_core::ports::DEFAULT_MAX_BACKLOG, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_backlog: u64,
    /// Largest the SQLite file may grow, in MiB; past it writes fail cleanly (the API
    /// answers 503 with `Retry-After`, `/healthz` says degraded) before the disk fills.
    /// The log file beside it (`-wal`) is cut back to a quarter of this (at most
    /// 16 MiB) after each burst. Unset: the disk is the limit. Example: 2048.
    #[arg(long, env = "ENTREGA_MAX_DB_SIZE_MB", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_db_size_mb: Option<u64>,
    /// A bearer token that may read `/metrics` besides the admin key.
    #[arg(long, env = "ENTREGA_METRICS_TOKEN", hide_env_values = true)]
    pub(crate) metrics_token: Option<String>,
    /// API connections served at once; at the cap the longest-idle one is closed for a
    /// new one. Example: 4096.
    #[arg(long, env = "ENTREGA_MAX_CONNECTIONS", default_value_t = entrega_embedded::http_server::DEFAULT_MAX_CONNECTIONS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_connections: u64,
    /// Drain a producer's transactional outbox in its own PostgreSQL, e.g.
    /// `postgres://entrega@db.internal/crm` (see `entrega outbox init`). Repeatable
    /// (in the variable, URLs separated by spaces); the same URL twice runs two
    /// drains of one table.
    #[arg(
        long = "outbox",
        env = "ENTREGA_OUTBOX_URL",
        hide_env_values = true,
        value_delimiter = ' '
    )]
    pub(crate) outboxes: Vec<String>,
    /// Log format.
    #[arg(long, env = "ENTREGA_LOG_FORMAT", value_enum, default_value = "text")]
    pub(crate) log_format: LogFormat,
}

/// A PostgreSQL URL given to `flag`. Parsed here rather than by clap, whose error
/// would echo the value, and the value may hold a password.
/// A PostgreSQL URL. Only the URL form: the driver also takes `host=… port=…`, but
/// `ENTREGA_OUTBOX_URL` holds URLs separated by spaces, so such a string became
/// several drains, each of one setting, each failing.
pub(crate) fn postgres_url(flag: &str, s: &str) -> Result<tokio_postgres::Config, String> {
    const FORM: &str = "postgres://user@host:port/database";
    if !(s.starts_with("postgres://") || s.starts_with("postgresql://")) {
        return Err(format!("{flag}: not a PostgreSQL URL ({FORM})"));
    }
    s.parse()
        .map_err(|e| format!("{flag}: not a PostgreSQL URL ({FORM}): {e}"))
}

#[derive(clap::Args)]
pub(crate) struct ListenArgs {
    /// Port to receive on, on 127.0.0.1 (0: any free port), e.g. 9000.
    #[arg(long, default_value_t = 9000)]
    pub(crate) port: u16,
    /// The endpoint's `whsec_…` secret (shown when the endpoint is created): each
    /// webhook's signature is verified with it.
    #[arg(long, env = "ENTREGA_LISTEN_SECRET", hide_env_values = true)]
    pub(crate) secret: Option<entrega_core::signature::Secret>,
    /// The HTTP status to answer with, 100 to 599; e.g. 500 to rehearse a failure.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u16).range(100..=599))]
    pub(crate) status: u16,
    /// Wait this long before answering, e.g. 250ms, 12s or 2m (past the endpoint's
    /// timeout, the attempt times out).
    #[arg(long, default_value = "0s", value_parser = entrega_embedded::listen::parse_delay)]
    pub(crate) delay: std::time::Duration,
    /// Stop after this many webhooks (for scripts); unset: until Ctrl-C.
    #[arg(long)]
    pub(crate) count: Option<u64>,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

pub(crate) fn parse_range(s: &str) -> Result<IpNet, String> {
    let s = s.trim();
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("`{s}` is not a CIDR range or an IP address"))
}
