//! `entrega endpoints list|show|stats|disable|enable`: a key's endpoints, and pausing
//! or resuming delivery to one.

use clap::Subcommand;
use serde_json::json;

use super::client::{cell, query, segment, CliError};
use super::{client, print, ApiArgs, Output, PageArgs};

#[derive(Subcommand)]
pub enum EndpointsCommand {
    /// Endpoints, newest first.
    List {
        #[command(flatten)]
        page: PageArgs,
    },
    /// One endpoint, secret included.
    Show {
        /// The endpoint's id, e.g. ep_0191….
        id: String,
    },
    /// The last 24 hours of an endpoint.
    Stats {
        /// The endpoint's id, e.g. ep_0191….
        id: String,
    },
    /// Pause delivery to an endpoint; its deliveries wait, none is lost.
    Disable {
        /// The endpoint's id, e.g. ep_0191….
        id: String,
    },
    /// Re-enable; its paused deliveries resume.
    Enable {
        /// The endpoint's id, e.g. ep_0191….
        id: String,
    },
}

pub async fn endpoints(args: &ApiArgs, command: EndpointsCommand) -> Result<(), CliError> {
    let api = client(args)?;
    let columns: (&[&str], &[&str]) = (
        &["ID", "URL", "TYPES", "MODE", "RETRY", "DISABLED"],
        &["id", "url", "event_types", "mode", "retry", "disabled"],
    );
    let patch = |id: &str, disabled: bool| {
        let path = format!("/v1/endpoints/{}", segment(id));
        let api = &api;
        async move {
            api.call(
                reqwest::Method::PATCH,
                &path,
                Some(json!({ "disabled": disabled })),
            )
            .await
        }
    };
    match command {
        EndpointsCommand::List { page } => {
            let q = query(&page.params());
            print(
                args,
                &api.get(&format!("/v1/endpoints{q}")).await?,
                columns.0,
                columns.1,
            )?
        }
        EndpointsCommand::Show { id } => {
            let endpoint = api.get(&format!("/v1/endpoints/{}", segment(&id))).await?;
            print(args, &endpoint, columns.0, columns.1)?;
            if args.output == Output::Table {
                println!("\nsecret: {}", cell(&endpoint["secret"]));
                if !endpoint["disabled_reason"].is_null() {
                    println!("disabled: {}", cell(&endpoint["disabled_reason"]));
                }
            }
        }
        EndpointsCommand::Stats { id } => {
            let stats = api
                .get(&format!("/v1/endpoints/{}/stats", segment(&id)))
                .await?;
            print(
                args,
                &stats,
                &[
                    "ATTEMPTS",
                    "DELIVERED",
                    "FAILED",
                    "MEDIAN MS",
                    "P95 MS",
                    "LAST ERROR",
                ],
                &[
                    "attempts",
                    "delivered",
                    "failed",
                    "median_ms",
                    "p95_ms",
                    "last_error",
                ],
            )?;
        }
        EndpointsCommand::Disable { id } => {
            print(args, &patch(&id, true).await?, columns.0, columns.1)?
        }
        EndpointsCommand::Enable { id } => {
            print(args, &patch(&id, false).await?, columns.0, columns.1)?
        }
    }
    Ok(())
}
