//! The `entrega` binary: `entrega serve` runs the whole product on one machine;
//! `provision` and `admin-key` are the operator's set-up commands.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
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
use tracing_subscriber::EnvFilter;

mod args;
use args::*;

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
        #[arg(long, env = "ENTREGA_OUTBOX_URL", hide_env_values = true)]
        postgres: String,
        /// The role `entrega serve --outbox` connects as: granted reading and deleting
        /// outbox rows and adding quarantined ones, nothing else.
        #[arg(long)]
        grant_to: Option<String>,
    },
}

fn init_logs(format: LogFormat) {
    // A RUST_LOG that cannot be read is said out loud: logging at `info` while the
    // operator believes they asked for `debug` hides what they came to look for.
    let (filter, refused) = match std::env::var(EnvFilter::DEFAULT_ENV) {
        Err(_) => (EnvFilter::new("info"), None),
        Ok(directives) => match EnvFilter::try_new(&directives) {
            Ok(filter) => (filter, None),
            Err(e) => (EnvFilter::new("info"), Some((directives, e.to_string()))),
        },
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    if let Some((directives, error)) = refused {
        tracing::warn!(rust_log = %directives, %error, "RUST_LOG could not be read; logging at info");
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
                retention: (args.retention_days > 0)
                    .then(|| chrono::Duration::days(args.retention_days.into())),
                outboxes: args
                    .outboxes
                    .iter()
                    .map(|url| postgres_url("--outbox", url))
                    .collect::<Result<_, _>>()?,
            })
            .await
        }
        Command::Outbox {
            command: OutboxCommand::Init { postgres, grant_to },
        } => {
            let postgres = postgres_url("--postgres", &postgres)?;
            let ready =
                entrega_embedded::pg_outbox::init_command(&postgres, grant_to.as_deref()).await?;
            println!("{ready}");
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
