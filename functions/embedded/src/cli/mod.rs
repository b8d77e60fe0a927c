//! The operator CLI: `entrega deliveries|resend|failures|endpoints|tenants …` over the HTTP API
//! with a key, so it works against `entrega serve` and the AWS API alike. Human tables
//! by default, `--output json` for scripts; an API error prints its title and detail and
//! exits non-zero.

pub mod client;
mod endpoints;
mod tenants;

pub use endpoints::{endpoints, EndpointsCommand};
pub use tenants::{tenants, TenantsCommand};

use chrono::{DateTime, Utc};
use clap::{Subcommand, ValueEnum};
use serde_json::{json, Value};

use client::{cell, query, segment, table, CliError, Client};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// Where the API is and how to answer, shared by every operator command.
#[derive(clap::Args)]
pub struct ApiArgs {
    /// The Entrega API.
    #[arg(
        long,
        env = "ENTREGA_URL",
        default_value = "http://127.0.0.1:8787",
        global = true
    )]
    pub url: String,
    /// An API key (a tenant's, or admin).
    #[arg(long, env = "ENTREGA_API_KEY", hide_env_values = true, global = true)]
    pub api_key: Option<String>,
    /// Human tables, or JSON for scripts.
    #[arg(long, value_enum, default_value = "table", global = true)]
    pub output: Output,
    /// Seconds to wait for an answer before giving up (a server that accepts and
    /// never answers would hold the command for good).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600), global = true)]
    pub timeout: u64,
}

/// The paging flags of every list.
#[derive(clap::Args)]
pub struct PageArgs {
    /// Rows per page, 1 to 200.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    /// Continue where the previous page ended (the `--cursor …` it printed).
    #[arg(long)]
    pub cursor: Option<String>,
}

impl PageArgs {
    /// As query parameters.
    pub fn params(self) -> [(&'static str, Option<String>); 2] {
        [
            ("limit", Some(self.limit.to_string())),
            ("cursor", self.cursor),
        ]
    }
}

#[derive(Subcommand)]
pub enum DeliveriesCommand {
    /// The delivery log, newest first.
    List {
        /// Only this endpoint's deliveries, e.g. ep_0191…
        #[arg(long)]
        endpoint: Option<String>,
        /// Only this status: pending, delivered, failed or exhausted.
        #[arg(long)]
        status: Option<String>,
        /// Only this event type, e.g. lead.stage_changed.
        #[arg(long)]
        event_type: Option<String>,
        /// Created at or after this time (RFC 3339), e.g. 2026-11-29T00:00:00Z.
        #[arg(long, value_parser = parse_time)]
        since: Option<DateTime<Utc>>,
        /// Created before this time (RFC 3339), e.g. 2026-11-30T00:00:00Z.
        #[arg(long, value_parser = parse_time)]
        until: Option<DateTime<Utc>>,
        #[command(flatten)]
        page: PageArgs,
    },
    /// One delivery with every attempt.
    Show {
        /// The delivery's id, e.g. dlv_0191….
        id: String,
    },
}

#[derive(clap::Args)]
pub struct ResendArgs {
    /// One delivery to try now, e.g. dlv_0191…
    pub id: Option<String>,
    /// Resend this endpoint's deliveries (with --since and --until), e.g. ep_0191…
    #[arg(long, conflicts_with = "id")]
    pub endpoint: Option<String>,
    /// Resend deliveries in this status: pending, delivered, failed or exhausted.
    #[arg(long, conflicts_with = "id")]
    pub status: Option<String>,
    /// Resend deliveries of this event type, e.g. lead.stage_changed.
    #[arg(long, conflicts_with = "id")]
    pub event_type: Option<String>,
    /// Start of the window (RFC 3339; at most 14 days before --until), e.g.
    /// 2026-11-29T00:00:00Z.
    #[arg(long, conflicts_with = "id", requires = "until", value_parser = parse_time)]
    pub since: Option<DateTime<Utc>>,
    /// End of the window (RFC 3339), e.g. 2026-11-30T00:00:00Z.
    #[arg(long, conflicts_with = "id", requires = "since", value_parser = parse_time)]
    pub until: Option<DateTime<Utc>>,
    /// Go on with a window where an earlier run stopped (the cursor it printed).
    #[arg(long, conflicts_with = "id", requires = "since")]
    pub cursor: Option<String>,
}

#[derive(Subcommand)]
pub enum FailuresCommand {
    /// Dead-letter records, newest first.
    List {
        /// Only acknowledged (true) or only unacknowledged (false) ones.
        #[arg(long)]
        acknowledged: Option<bool>,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Mark a failure analyzed.
    Ack {
        /// The failure's id, e.g. fail_0191….
        id: String,
        /// What was found or fixed, e.g. "receiver fixed" (without it, an earlier
        /// note is kept).
        #[arg(long)]
        note: Option<String>,
    },
    /// Send a failed delivery again now (its failure record stays for the log).
    Resend {
        /// The failure's id, e.g. fail_0191….
        id: String,
    },
}

/// A time flag: RFC 3339, and an error that shows the form.
pub fn parse_time(raw: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(raw)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("{e}: expected an RFC 3339 time, e.g. 2026-11-29T00:00:00Z"))
}

fn client(args: &ApiArgs) -> Result<Client, CliError> {
    let key = args
        .api_key
        .as_deref()
        .ok_or_else(|| CliError("an API key is needed: --api-key or ENTREGA_API_KEY".into()))?;
    Client::new(&args.url, key, std::time::Duration::from_secs(args.timeout))
}

fn print(args: &ApiArgs, value: &Value, headers: &[&str], fields: &[&str]) -> Result<(), CliError> {
    // What the API answers: an object, and a list's `data` an array of objects.
    // Anything else came from another server; printed, it made up a row.
    let rows: Vec<&Value> = match value.get("data") {
        Some(Value::Array(rows)) => rows.iter().collect(),
        Some(_) => vec![&Value::Null],
        None => vec![value],
    };
    if rows.iter().any(|r| !r.is_object()) {
        return Err(CliError(
            "the answer is not shaped as Entrega's API answers (check --url or ENTREGA_URL)".into(),
        ));
    }
    if args.output == Output::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(value).unwrap_or_default()
        );
        return Ok(());
    }
    let value = &with_display_numbers(value.clone());
    let rows: Vec<&Value> = match value.get("data").and_then(Value::as_array) {
        Some(rows) => rows.iter().collect(),
        None => vec![value],
    };
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| fields.iter().map(|f| cell(&r[*f])).collect())
        .collect();
    println!("{}", table(headers, &rows));
    if let Some(cursor) = value.get("next_cursor").and_then(Value::as_str) {
        println!("(more: --cursor {cursor})");
    }
    Ok(())
}

/// A delivery's row: `GEN` counts resends (1 = the original schedule), `ATTEMPTS` the
/// attempts of the current generation.
const DELIVERY_COLUMNS: (&[&str], &[&str]) = (
    &[
        "ID", "EVENT", "TYPE", "ENDPOINT", "STATUS", "GEN", "ATTEMPTS", "LAST", "CREATED",
    ],
    &[
        "id",
        "event_id",
        "event_type",
        "endpoint_id",
        "status",
        "generation_number",
        "attempt_count",
        "last_status_code",
        "created_at",
    ],
);

/// Add what the tables show but the API does not spell out: the generation counted
/// from 1, and each attempt numbered `generation.attempt` (`2.1`: the first attempt of
/// the first resend), so attempts of different generations never share a number.
fn with_display_numbers(mut value: Value) -> Value {
    fn label(row: &mut Value) {
        let generation = row["generation"].as_u64().unwrap_or(0) + 1;
        row["generation_number"] = json!(generation);
        if let Some(number) = row["number"].as_u64() {
            row["attempt"] = json!(format!("{generation}.{number}"));
        }
    }
    if let Some(rows) = value.get_mut("data").and_then(Value::as_array_mut) {
        rows.iter_mut().for_each(label);
    } else {
        label(&mut value);
    }
    if let Some(attempts) = value.get_mut("attempts").and_then(Value::as_array_mut) {
        attempts.iter_mut().for_each(label);
    }
    value
}

pub async fn deliveries(args: &ApiArgs, command: DeliveriesCommand) -> Result<(), CliError> {
    let api = client(args)?;
    match command {
        DeliveriesCommand::List {
            endpoint,
            status,
            event_type,
            since,
            until,
            page,
        } => {
            let q = query(
                &[
                    ("endpoint_id", endpoint),
                    ("status", status),
                    ("event_type", event_type),
                    ("since", since.map(|t| t.to_rfc3339())),
                    ("until", until.map(|t| t.to_rfc3339())),
                ]
                .into_iter()
                .chain(page.params())
                .collect::<Vec<_>>(),
            );
            let page = api.get(&format!("/v1/deliveries{q}")).await?;
            print(args, &page, DELIVERY_COLUMNS.0, DELIVERY_COLUMNS.1)?;
        }
        DeliveriesCommand::Show { id } => {
            let d = api.get(&format!("/v1/deliveries/{}", segment(&id))).await?;
            print(args, &d, DELIVERY_COLUMNS.0, DELIVERY_COLUMNS.1)?;
            if args.output == Output::Table {
                let attempts = json!({ "data": with_display_numbers(d.clone())["attempts"] });
                println!();
                print(
                    args,
                    &attempts,
                    &["#", "STARTED", "MS", "STATUS", "ERROR", "TRIGGER", "BY"],
                    &[
                        "attempt",
                        "started_at",
                        "duration_ms",
                        "status_code",
                        "error",
                        "trigger",
                        "requested_by",
                    ],
                )?;
            }
        }
    }
    Ok(())
}

/// The batch resend's progress line: it pages through the window, so the total is
/// known only at the end.
const PROGRESS_TEMPLATE: &str = "{spinner} resending… {pos} queued ({msg}, {elapsed})";
/// How often the spinner turns while a page is requested.
const PROGRESS_TICK: std::time::Duration = std::time::Duration::from_millis(120);

pub async fn resend(args: &ApiArgs, r: ResendArgs) -> Result<(), CliError> {
    let api = client(args)?;
    if let Some(id) = r.id {
        let d = api
            .post(
                &format!("/v1/deliveries/{}/resend", segment(&id)),
                json!({}),
            )
            .await?;
        print(args, &d, DELIVERY_COLUMNS.0, DELIVERY_COLUMNS.1)?;
        return Ok(());
    }
    let (Some(since), Some(until)) = (r.since, r.until) else {
        return Err(CliError(
            "give a delivery id, or --since and --until with filters".into(),
        ));
    };
    // Page through the window, one bounded request at a time, showing progress.
    let mut body = json!({
        "endpoint_id": r.endpoint, "status": r.status, "event_type": r.event_type,
        "since": since.to_rfc3339(), "until": until.to_rfc3339(), "cursor": r.cursor,
    });
    body.as_object_mut()
        .expect("an object")
        .retain(|_, v| !v.is_null());
    // Drawn on stderr, and only on a terminal: scripts and pipes see the summary alone.
    let progress = if args.output == Output::Table {
        indicatif::ProgressBar::new_spinner()
    } else {
        indicatif::ProgressBar::hidden()
    };
    progress.set_style(
        indicatif::ProgressStyle::with_template(PROGRESS_TEMPLATE).expect("a valid template"),
    );
    progress.set_message("0 requests");
    progress.enable_steady_tick(PROGRESS_TICK);
    let mut requests = 0u64;
    loop {
        let answer = match api.post("/v1/deliveries/resend", body.clone()).await {
            Ok(answer) => answer,
            Err(e) => {
                progress.abandon();
                return Err(stopped_part_way(e, progress.position(), requests, &body));
            }
        };
        requests += 1;
        progress.inc(answer["queued"].as_u64().unwrap_or(0));
        progress.set_message(format!("{requests} request(s)"));
        match answer["next_cursor"].as_str() {
            Some(cursor) => body["cursor"] = json!(cursor),
            None => break,
        }
    }
    let total = progress.position();
    progress.finish_and_clear();
    if args.output == Output::Json {
        println!("{}", json!({ "queued": total, "requests": requests }));
    } else {
        println!("{total} deliveries queued for resend ({requests} request(s))");
    }
    Ok(())
}

/// A window's resend that failed after `requests` pages were answered: the error, with
/// what was done and where to go on. Without it, the only way on was to run the whole
/// window again, resending what was done (a hostile test).
fn stopped_part_way(error: CliError, queued: u64, requests: u64, body: &Value) -> CliError {
    let Some(cursor) = body["cursor"].as_str().filter(|_| requests > 0) else {
        return error;
    };
    CliError(format!(
        "{error}\n{queued} deliveries were queued for resend in {requests} request(s) \
         before this; to go on, run the same command with --cursor {cursor} (the page \
         under way when it failed may be resent in part)"
    ))
}

pub async fn failures(args: &ApiArgs, command: FailuresCommand) -> Result<(), CliError> {
    let api = client(args)?;
    let columns: (&[&str], &[&str]) = (
        &[
            "ID", "DELIVERY", "TYPE", "REASON", "LAST", "ERROR", "ACKED", "BY",
        ],
        &[
            "id",
            "delivery_id",
            "event_type",
            "reason",
            "last_status_code",
            "last_error",
            "acknowledged_at",
            "acknowledged_by",
        ],
    );
    match command {
        FailuresCommand::List { acknowledged, page } => {
            let q = query(
                &[("acknowledged", acknowledged.map(|a| a.to_string()))]
                    .into_iter()
                    .chain(page.params())
                    .collect::<Vec<_>>(),
            );
            print(
                args,
                &api.get(&format!("/v1/failures{q}")).await?,
                columns.0,
                columns.1,
            )?;
        }
        FailuresCommand::Ack { id, note } => {
            let f = api
                .post(
                    &format!("/v1/failures/{}/ack", segment(&id)),
                    match note {
                        Some(note) => json!({ "note": note }),
                        None => json!({}),
                    },
                )
                .await?;
            print(args, &f, columns.0, columns.1)?;
        }
        FailuresCommand::Resend { id } => {
            let d = api
                .post(&format!("/v1/failures/{}/resend", segment(&id)), json!({}))
                .await?;
            print(args, &d, DELIVERY_COLUMNS.0, DELIVERY_COLUMNS.1)?;
        }
    }
    Ok(())
}
