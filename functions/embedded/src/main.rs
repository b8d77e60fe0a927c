//! The `entrega` binary: `entrega serve` runs the whole product on one machine.

use std::io::IsTerminal;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use entrega_embedded::serve::{serve, ServeConfig};
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
    /// Run the API, the outbox trigger, the delivery worker and the failure handler
    /// over a SQLite file.
    Serve(ServeArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Address the API listens on.
    #[arg(long, env = "ENTREGA_LISTEN", default_value = "127.0.0.1:8787")]
    listen: SocketAddr,
    /// The SQLite database file (created if missing).
    #[arg(long, env = "ENTREGA_DB", default_value = "./entrega.db")]
    db: PathBuf,
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
    /// Log format.
    #[arg(long, env = "ENTREGA_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
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

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            init_logs(args.log_format);
            let config = ServeConfig {
                listen: args.listen,
                db: args.db,
                targets: TargetPolicy {
                    allowed_ranges: args.allow_targets,
                    allow_http: args.allow_http,
                },
                admin_key: args.admin_key,
                alert_threshold: args.alert_threshold,
            };
            match serve(config).await {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("entrega: {e}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
    }
}
