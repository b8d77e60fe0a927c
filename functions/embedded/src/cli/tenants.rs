//! `entrega tenants create|list|show`: the tenants an admin key manages, and the one a
//! tenant key belongs to.

use clap::Subcommand;
use serde_json::{json, Value};

use super::client::{query, segment, CliError};
use super::{client, print, ApiArgs, Output, PageArgs};

#[derive(Subcommand)]
pub enum TenantsCommand {
    /// Create a tenant (admin key) and print its API key, shown this once.
    Create {
        /// The tenant's name, 1 to 200 characters, e.g. "Acme CRM".
        #[arg(long)]
        name: String,
        /// Where the tenant's owner notices go, e.g. ops@acme.example.
        #[arg(long)]
        owner_email: String,
        /// Choose the id (`ten_` and 32 hex digits); generated otherwise.
        #[arg(long)]
        id: Option<String>,
    },
    /// Tenants, newest first (admin key).
    List {
        #[command(flatten)]
        page: PageArgs,
    },
    /// One tenant (admin key, or that tenant's own key).
    Show {
        /// The tenant's id, e.g. ten_0191….
        id: String,
    },
}

const HEADERS: &[&str] = &["ID", "NAME", "OWNER", "CREATED"];
const FIELDS: &[&str] = &["id", "name", "owner_email", "created_at"];

pub async fn tenants(args: &ApiArgs, command: TenantsCommand) -> Result<(), CliError> {
    let api = client(args)?;
    match command {
        TenantsCommand::Create {
            name,
            owner_email,
            id,
        } => {
            let mut body = json!({ "name": name, "owner_email": owner_email });
            if let Some(id) = id {
                body["id"] = Value::String(id);
            }
            let created = api.post("/v1/tenants", body).await?;
            if args.output == Output::Json {
                print(args, &created, &[], &[])?;
            } else {
                print(args, &created["tenant"], HEADERS, FIELDS)?;
                println!(
                    "\napi key (shown once, keep it): {}",
                    created["api_key"].as_str().unwrap_or_default()
                );
            }
        }
        TenantsCommand::List { page } => {
            let q = query(&page.params());
            print(
                args,
                &api.get(&format!("/v1/tenants{q}")).await?,
                HEADERS,
                FIELDS,
            )?;
        }
        TenantsCommand::Show { id } => {
            print(
                args,
                &api.get(&format!("/v1/tenants/{}", segment(&id))).await?,
                HEADERS,
                FIELDS,
            )?;
        }
    }
    Ok(())
}
