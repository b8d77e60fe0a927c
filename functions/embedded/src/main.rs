//! The `entrega` binary: `entrega serve` runs the whole product on one machine;
//! `provision` and `admin-key` are the operator's set-up commands.

use std::io::IsTerminal;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
#[cfg(feature = "aws")]
use entrega_aws::provision::provision;
#[cfg(feature = "aws")]
use entrega_aws::resources::{dynamo_store, sdk_config, AwsResources, ResourceNames};
use entrega_core::ports::{Settings, SystemClock};
use entrega_embedded::cli::{
    self, ApiArgs, DeliveriesCommand, EndpointsCommand, FailuresCommand, ResendArgs, TenantsCommand,
};
use entrega_embedded::notifier::{AlertWebhook, SmtpRelay};
use entrega_embedded::serve::{mint_admin_key, serve, Backend, BoxError, ServeConfig};
use entrega_embedded::sqlite::{SqliteDb, SqliteStore};
use entrega_http::transport::TargetPolicy;
use ipnet::IpNet;
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(name = "entrega", version, about = "Reliable webhook delivery")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the API, the outbox trigger, the delivery worker and the failure handler.
    Serve(ServeArgs),
    /// Create the tables, queues, scheduler group and alert topic (idempotent; for an
    /// emulator or a test account — production deploys with template.yaml).
    Provision(StorageArgs),
    /// Mint a new admin API key, store its hash, and print the key once.
    AdminKey(StorageArgs),
    /// A webhook receiver for development: prints each webhook, checks its signature,
    /// and answers with the status you choose (to rehearse failures).
    Listen(ListenArgs),
    /// The delivery log.
    Deliveries {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        command: DeliveriesCommand,
    },
    /// Resend one delivery now, or every delivery matching a filter in a window.
    Resend {
        #[command(flatten)]
        api: ApiArgs,
        #[command(flatten)]
        args: ResendArgs,
    },
    /// Dead-letter records.
    Failures {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        command: FailuresCommand,
    },
    /// Endpoints.
    Endpoints {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        command: EndpointsCommand,
    },
    /// The outbox: `entrega outbox replay --backend aws --since …` fans out again the
    /// events committed since a time (after the outbox trigger gave up on some);
    /// `entrega outbox init --postgres URL` prepares a producer's PostgreSQL outbox.
    Outbox {
        #[command(subcommand)]
        command: OutboxCommand,
    },
    /// Tenants and their API keys.
    Tenants {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        command: TenantsCommand,
    },
}

#[derive(Subcommand)]
enum OutboxCommand {
    /// Fan out again every event committed at or after --since: idempotent (existing
    /// deliveries are found, not made twice), so it is safe to repeat.
    Replay {
        #[command(flatten)]
        storage: StorageArgs,
        /// Replay events created at or after this time (RFC 3339), e.g.
        /// 2026-11-29T00:00:00Z.
        #[arg(long, value_parser = cli::parse_time)]
        since: chrono::DateTime<chrono::Utc>,
    },
    /// Create `entrega_outbox`, its quarantine table and its NOTIFY trigger in the
    /// producer's PostgreSQL (idempotent).
    Init {
        /// The producer's database, e.g. `postgres://owner@db.internal/crm`.
        #[arg(long, env = "ENTREGA_OUTBOX_URL", hide_env_values = true, value_parser = parse_postgres_url_boxed)]
        postgres: Box<tokio_postgres::Config>,
        /// The role `entrega serve --outbox` connects as: granted reading and deleting
        /// outbox rows and adding quarantined ones, nothing else.
        #[arg(long)]
        grant_to: Option<String>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendKind {
    Sqlite,
    Aws,
}

#[derive(clap::Args)]
struct StorageArgs {
    /// Where the data lives.
    #[arg(long, env = "ENTREGA_BACKEND", value_enum, default_value = "sqlite")]
    backend: BackendKind,
    /// The SQLite database file (`serve` creates it if missing; `admin-key` needs it).
    #[arg(long, env = "ENTREGA_DB", default_value = "./entrega.db")]
    db: PathBuf,
    /// How SQLite commits are made durable: `full` (each commit on disk before it is
    /// confirmed; an accepted event survives a power loss) or `normal` (survives a
    /// crash of the process, not of the machine; faster on slow disks).
    #[arg(long, env = "ENTREGA_DURABILITY", value_enum, default_value = "full")]
    durability: entrega_embedded::sqlite::Durability,
    /// Name prefix of the AWS resources (a deployed stack's name).
    #[arg(long, env = "ENTREGA_AWS_PREFIX", default_value = "entrega")]
    aws_prefix: String,
}

impl StorageArgs {
    fn backend(&self) -> Backend {
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
struct ServeArgs {
    #[command(flatten)]
    storage: StorageArgs,
    /// Address the API listens on.
    #[arg(long, env = "ENTREGA_LISTEN", default_value = "127.0.0.1:8787")]
    listen: SocketAddr,
    /// Let deliveries reach this otherwise forbidden range (CIDR or single address),
    /// e.g. 127.0.0.0/8 for receivers on this machine. Repeatable.
    #[arg(long = "allow-target", env = "ENTREGA_ALLOW_TARGETS", value_delimiter = ',', value_parser = parse_range)]
    allow_targets: Vec<IpNet>,
    /// Permit http:// targets (otherwise https only).
    #[arg(long, env = "ENTREGA_ALLOW_HTTP", value_parser = clap::builder::BoolishValueParser::new(), default_value_t = false, num_args = 0, default_missing_value = "true")]
    allow_http: bool,
    /// The admin API key; when unset, one is generated at first start and printed once.
    #[arg(long, env = "ENTREGA_ADMIN_KEY", hide_env_values = true)]
    admin_key: Option<String>,
    /// Failures per tenant per hour above which an alert is raised.
    #[arg(long, env = "ENTREGA_ALERT_THRESHOLD", default_value_t = entrega_core::handlers::failures::DEFAULT_ALERT_THRESHOLD)]
    alert_threshold: u64,
    /// Where on-call alerts are POSTed (signed JSON); unset: they are logged.
    #[arg(long, env = "ENTREGA_ALERT_WEBHOOK", requires = "alert_webhook_secret")]
    alert_webhook: Option<String>,
    /// The `whsec_…` secret alert webhooks are signed with.
    #[arg(long, env = "ENTREGA_ALERT_WEBHOOK_SECRET", hide_env_values = true)]
    alert_webhook_secret: Option<entrega_core::signature::Secret>,
    /// SMTP server for owner notices, e.g. `smtp://user:pass@mail.example.com:587?tls=required`;
    /// unset: owner notices are logged.
    #[arg(
        long,
        env = "ENTREGA_SMTP_URL",
        hide_env_values = true,
        requires = "smtp_from"
    )]
    smtp_url: Option<String>,
    /// The sender of owner notices, e.g. `Entrega <notices@example.com>`.
    #[arg(long, env = "ENTREGA_SMTP_FROM")]
    smtp_from: Option<lettre::message::Mailbox>,
    /// Days of failing every attempt after which an endpoint is disabled.
    #[arg(long, env = "ENTREGA_UNHEALTHY_AFTER_DAYS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    unhealthy_after_days: u64,
    /// API requests per second per key (token bucket; the burst is twice this).
    #[arg(long, env = "ENTREGA_API_RATE_LIMIT", default_value_t = entrega_http::api::rate_limit::DEFAULT_RATE_PER_SECOND, value_parser = clap::value_parser!(u32).range(1..))]
    api_rate_limit: u32,
    /// Waiting deliveries per tenant past which `POST /v1/events` answers 429 with
    /// `Retry-After` (backpressure before the disk fills), e.g. 100000.
    #[arg(long, env = "ENTREGA_MAX_BACKLOG", default_value_t = entrega_core::ports::DEFAULT_MAX_BACKLOG, value_parser = clap::value_parser!(u64).range(1..))]
    max_backlog: u64,
    /// Largest the SQLite file may grow, in MiB; past it writes fail cleanly (the API
    /// answers 503 with `Retry-After`, `/healthz` says degraded) before the disk fills.
    /// Unset: the disk is the limit. Example: 2048.
    #[arg(long, env = "ENTREGA_MAX_DB_SIZE_MB", value_parser = clap::value_parser!(u64).range(1..))]
    max_db_size_mb: Option<u64>,
    /// A bearer token that may read `/metrics` besides the admin key.
    #[arg(long, env = "ENTREGA_METRICS_TOKEN", hide_env_values = true)]
    metrics_token: Option<String>,
    /// API connections served at once; at the cap the longest-idle one is closed for a
    /// new one. Example: 4096.
    #[arg(long, env = "ENTREGA_MAX_CONNECTIONS", default_value_t = entrega_embedded::http_server::DEFAULT_MAX_CONNECTIONS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: u64,
    /// Drain a producer's transactional outbox in its own PostgreSQL, e.g.
    /// `postgres://entrega@db.internal/crm` (see `entrega outbox init`). Repeatable;
    /// the same URL twice runs two drains of one table.
    #[arg(long = "outbox", env = "ENTREGA_OUTBOX_URL", hide_env_values = true, value_delimiter = ' ', value_parser = parse_postgres_url)]
    outboxes: Vec<tokio_postgres::Config>,
    /// Log format.
    #[arg(long, env = "ENTREGA_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
}

/// A PostgreSQL URL, named in the error without echoing it (it may hold a password).
fn parse_postgres_url(s: &str) -> Result<tokio_postgres::Config, String> {
    s.parse()
        .map_err(|e| format!("not a PostgreSQL URL (postgres://user@host:port/database): {e}"))
}

fn parse_postgres_url_boxed(s: &str) -> Result<Box<tokio_postgres::Config>, String> {
    parse_postgres_url(s).map(Box::new)
}

#[derive(clap::Args)]
struct ListenArgs {
    /// Port to receive on, on 127.0.0.1 (0: any free port), e.g. 9000.
    #[arg(long, default_value_t = 9000)]
    port: u16,
    /// The endpoint's `whsec_…` secret (shown when the endpoint is created): each
    /// webhook's signature is verified with it.
    #[arg(long, env = "ENTREGA_LISTEN_SECRET", hide_env_values = true)]
    secret: Option<entrega_core::signature::Secret>,
    /// The HTTP status to answer with, 100 to 599; e.g. 500 to rehearse a failure.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u16).range(100..=599))]
    status: u16,
    /// Wait this long before answering, e.g. 250ms, 12s or 2m (past the endpoint's
    /// timeout, the attempt times out).
    #[arg(long, default_value = "0s", value_parser = entrega_embedded::listen::parse_delay)]
    delay: std::time::Duration,
    /// Stop after this many webhooks (for scripts); unset: until Ctrl-C.
    #[arg(long)]
    count: Option<u64>,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn parse_range(s: &str) -> Result<IpNet, String> {
    let s = s.trim();
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("`{s}` is not a CIDR range or an IP address"))
}

fn init_logs(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn run(command: Command) -> Result<(), BoxError> {
    match command {
        Command::Serve(args) => {
            init_logs(args.log_format);
            serve(ServeConfig {
                listen: args.listen,
                backend: args.storage.backend(),
                targets: TargetPolicy {
                    allowed_ranges: args.allow_targets,
                    allow_http: args.allow_http,
                },
                admin_key: args.admin_key,
                settings: Settings {
                    alert_threshold: args.alert_threshold,
                    unhealthy_after: std::time::Duration::from_secs(
                        args.unhealthy_after_days * 86_400,
                    ),
                    max_backlog: args.max_backlog,
                    ..Settings::default()
                },
                alert_webhook: args
                    .alert_webhook
                    .zip(args.alert_webhook_secret)
                    .map(|(url, secret)| AlertWebhook { url, secret }),
                smtp: args
                    .smtp_url
                    .zip(args.smtp_from)
                    .map(|(url, from)| SmtpRelay { url, from }),
                api_rate_limit: args.api_rate_limit,
                max_db_size: args.max_db_size_mb.map(|mb| mb * 1024 * 1024),
                metrics_token: args.metrics_token,
                max_connections: args.max_connections as usize,
                outboxes: args.outboxes,
            })
            .await
        }
        Command::Outbox {
            command: OutboxCommand::Init { postgres, grant_to },
        } => {
            let (mut client, connection) = postgres.connect(tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            entrega_embedded::pg_outbox::schema::init(&mut client, grant_to.as_deref())
                .await
                .map_err(|e| entrega_embedded::pg_outbox::error_text(&e))?;
            println!(
                "entrega_outbox ready in {}",
                entrega_embedded::pg_outbox::describe(&postgres)
            );
            Ok(())
        }
        Command::Provision(args) => provision_aws(&args).await,
        Command::Listen(args) => {
            entrega_embedded::listen::listen(entrega_embedded::listen::ListenConfig {
                listen: SocketAddr::from(([127, 0, 0, 1], args.port)),
                secret: args.secret,
                status: axum::http::StatusCode::from_u16(args.status)
                    .map_err(|e| format!("--status: {e}"))?,
                delay: args.delay,
                count: args.count,
            })
            .await
        }
        Command::Deliveries { api, command } => Ok(cli::deliveries(&api, command).await?),
        Command::Resend { api, args } => Ok(cli::resend(&api, args).await?),
        Command::Failures { api, command } => Ok(cli::failures(&api, command).await?),
        Command::Endpoints { api, command } => Ok(cli::endpoints(&api, command).await?),
        Command::Tenants { api, command } => Ok(cli::tenants(&api, command).await?),
        Command::Outbox {
            command: OutboxCommand::Replay { storage, since },
        } => match storage.backend() {
            // The embedded outbox poller retries every row not yet fanned out by itself.
            Backend::Sqlite { .. } => Err("outbox replay is for --backend aws: the embedded \
                 runtime fans out every committed row by itself (its outbox poller)"
                .into()),
            Backend::Aws { prefix } => replay_aws(&prefix, since).await,
        },
        Command::AdminKey(args) => {
            let key = match args.backend() {
                // The store alone: a running `serve` on the same file keeps its work.
                Backend::Sqlite { db, durability } => {
                    // A key minted into a new, empty file would be one no server
                    // knows: only an existing database gets one.
                    if !db.exists() {
                        return Err(format!(
                            "no database at {}; point --db (or ENTREGA_DB) at the file \
                             `entrega serve` uses (serve creates it at its first start)",
                            db.display()
                        )
                        .into());
                    }
                    let store = SqliteStore::new(
                        SqliteDb::open_with(&db, durability)?,
                        Arc::new(SystemClock),
                    );
                    mint_admin_key(&store).await?
                }
                Backend::Aws { prefix } => aws_admin_key(&prefix).await?,
            };
            println!("{key}");
            Ok(())
        }
    }
}

/// `entrega provision --backend aws`.
#[cfg(feature = "aws")]
async fn provision_aws(args: &StorageArgs) -> Result<(), BoxError> {
    if args.backend != BackendKind::Aws {
        return Err("provision is for --backend aws; the SQLite file creates itself".into());
    }
    let spec = provision(
        &sdk_config().await,
        &ResourceNames::with_prefix(&args.aws_prefix),
    )
    .await?;
    for t in &spec.tables {
        println!("table {}", t.name);
    }
    for q in &spec.queues {
        println!("queue {}", q.name);
    }
    println!(
        "schedule group {}\ntopics {} (paging), {} (notification)",
        spec.schedule_group, spec.alert_topic, spec.notification_topic
    );
    Ok(())
}

#[cfg(not(feature = "aws"))]
async fn provision_aws(_: &StorageArgs) -> Result<(), BoxError> {
    Err(entrega_embedded::serve::NO_AWS.into())
}

/// A new admin key in the AWS store.
#[cfg(feature = "aws")]
async fn aws_admin_key(prefix: &str) -> Result<String, BoxError> {
    let sdk = sdk_config().await;
    let resources = AwsResources::discover(&sdk, prefix).await?;
    mint_admin_key(&dynamo_store(&sdk, &resources, Arc::new(SystemClock))).await
}

#[cfg(not(feature = "aws"))]
async fn aws_admin_key(_: &str) -> Result<String, BoxError> {
    Err(entrega_embedded::serve::NO_AWS.into())
}

/// `entrega outbox replay --backend aws`: the fan-out again over the outbox table, a
/// page at a time, printing what it did.
#[cfg(feature = "aws")]
async fn replay_aws(prefix: &str, since: chrono::DateTime<chrono::Utc>) -> Result<(), BoxError> {
    use entrega_core::handlers::replay::replay_outbox;
    let sdk = sdk_config().await;
    let resources = AwsResources::discover(&sdk, prefix).await?;
    // The fan-out sends no webhook: a transport that refuses everything is enough.
    let transport = Arc::new(entrega_http::transport::HttpTransport::new(
        TargetPolicy::default(),
    ));
    let services =
        entrega_aws::resources::aws_services(&sdk, &resources, transport, Arc::new(SystemClock));
    let (mut events, mut deliveries, mut malformed, mut cursor) = (0, 0, 0, None);
    loop {
        let step = replay_outbox(&services, since, cursor.as_deref()).await?;
        events += step.events;
        deliveries += step.deliveries;
        malformed += step.malformed;
        eprintln!("replayed {events} event(s), {deliveries} deliveries…");
        match step.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    println!("{events} event(s) since {since} fanned out again: {deliveries} deliveries (existing ones untouched)");
    if malformed > 0 {
        println!(
            "{malformed} outbox item(s) skipped: not events (malformed; the trigger parked each in the outbox DLQ with its reason)"
        );
    }
    Ok(())
}

#[cfg(not(feature = "aws"))]
async fn replay_aws(_: &str, _: chrono::DateTime<chrono::Utc>) -> Result<(), BoxError> {
    Err(entrega_embedded::serve::NO_AWS.into())
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    match run(Cli::parse().command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("entrega: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every subcommand and every flag says what it does (`--help` has no blanks).
    #[test]
    fn every_flag_of_every_command_says_what_it_does() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                let name = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() {
                    missing.push(format!("{name} (no description)"));
                }
                walk(sub, &name, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "entrega", &mut missing);
        assert!(missing.is_empty(), "without help text: {missing:?}");
    }
}
