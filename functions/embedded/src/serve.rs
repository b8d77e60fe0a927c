//! `entrega serve`: wire a backend's adapters, the transport, the workers and the API
//! router into one process, and stop it cleanly. The SQLite backend runs the
//! in-process runtime; the AWS backend runs the Lambda functions' handlers fed by
//! local pollers (Lambda's event source mappings, played here).

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::lane_slots::LaneSlots;
#[cfg(feature = "aws")]
use entrega_aws::emulation::Emulation;
#[cfg(feature = "aws")]
use entrega_aws::resources::{sdk_config, services_on, AwsClients, AwsResources};
use entrega_core::conditions::Conditions;
use entrega_core::ports::{
    Clock, NoMetrics, Notifier, Services, Settings, SystemClock, TenantStore,
};
use entrega_core::tenant::{generate_api_key, hash_api_key, Principal};
use entrega_http::api::rate_limit::RateLimiter;
use entrega_http::api::{router, App, AppState};
use entrega_http::transport::{HttpTransport, TargetPolicy};
use tokio::sync::watch;

use crate::fan_out::{
    AfterPublish, FanOutBesideRequest, FanOutsUnderWay, InlineFanOut, PublishAndFanOut,
};
use crate::metrics::PrometheusMetrics;
use crate::notifier::{AlertWebhook, EmbeddedNotifier, SmtpRelay};
use crate::runtime::{Runtime, WorkerSlots};
use crate::sqlite::backlog::EmbeddedBacklog;
use crate::sqlite::queue::{SqliteQueue, DELIVERY_QUEUE, FAILURE_QUEUE};
use crate::sqlite::{Durability, SqliteDb, SqliteStore};

/// Shortest admin key accepted from the environment: a short key can be guessed.
pub const MIN_ADMIN_KEY_LEN: usize = 24;

/// Where the data lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    Sqlite {
        db: PathBuf,
        durability: Durability,
    },
    /// AWS services (or an emulator at `AWS_ENDPOINT_URL`), resources named by prefix.
    Aws {
        prefix: String,
    },
}

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub backend: Backend,
    pub targets: TargetPolicy,
    pub admin_key: Option<String>,
    pub settings: Settings,
    /// Where on-call alerts go (signed POSTs); `None`: the log.
    pub alert_webhook: Option<AlertWebhook>,
    /// Where owner notices are e-mailed through; `None`: the log.
    pub smtp: Option<SmtpRelay>,
    /// API requests per second per key (burst: twice as many).
    pub api_rate_limit: u32,
    /// Largest the SQLite file may grow (bytes); `None`: the disk is the limit.
    pub max_db_size: Option<u64>,
    /// A bearer token that may read `/metrics` besides the admin key.
    pub metrics_token: Option<String>,
    /// Connections the API serves at once.
    pub max_connections: usize,
    /// How long the SQLite store keeps settled records (see
    /// [`crate::sqlite::retention`]); `None`: forever.
    pub retention: Option<chrono::Duration>,
    /// Producers' PostgreSQL outboxes to drain, one drain each (the same one twice:
    /// two drains of one table).
    pub outboxes: Vec<tokio_postgres::Config>,
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a build without the `aws` feature says to `--backend aws`.
pub const NO_AWS: &str = "this entrega was built without the AWS backend; build it with \
    `cargo build --release --features aws` (or `cargo install --path functions/embedded --features aws`)";

/// Run until SIGINT or SIGTERM.
pub async fn serve(config: ServeConfig) -> Result<(), BoxError> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let transport = Arc::new(HttpTransport::new(config.targets.clone()));
    let metrics = Arc::new(PrometheusMetrics::default());
    let conditions = Arc::new(Conditions::default());
    let notifier: Arc<dyn Notifier> = Arc::new(EmbeddedNotifier::new(
        config.alert_webhook.clone(),
        config.smtp.clone(),
    )?);
    crate::http_server::raise_file_limit();
    match &config.backend {
        Backend::Sqlite { db, durability } => {
            // The port first: a start that cannot listen leaves no database behind
            // (it created an empty file at a new --db). Requests arriving while the
            // database opens wait in the listen backlog.
            let listener = bind(&config).await?;
            let lock = crate::db_lock::lock_database(db)?;
            let (mut services, backlog) =
                open_sqlite_parts(db, *durability, clock, transport).await?;
            // Under the lock: no other process serves this database, so a claim left
            // is one a crash ended.
            let released = backlog.store.release_request_claims().await?;
            if released > 0 {
                tracing::info!(
                    released,
                    "released the Idempotency-Key claims of requests the previous process was running"
                );
            }
            if let Some(bytes) = config.max_db_size {
                backlog.store.db().limit_size(bytes).await?;
            }
            services.notifier = notifier;
            services.metrics = metrics.clone();
            services.settings = config.settings.clone();
            let under_way = FanOutsUnderWay::default();
            let inline = Arc::new(InlineFanOut {
                services: services.clone(),
                store: backlog.store.clone(),
                under_way: under_way.clone(),
            });
            let runtime = Runtime {
                services: services.clone(),
                store: backlog.store.clone(),
                delivery_queue: backlog.deliveries.clone(),
                conditions: conditions.clone(),
                fan_outs_under_way: under_way,
                retention: config.retention,
                slots: WorkerSlots::default(),
            };
            let publisher = Arc::new(PublishAndFanOut {
                store: backlog.store.clone(),
                queue: backlog.deliveries.clone(),
                clock: services.clock.clone(),
                beside: FanOutBesideRequest::new(inline.clone()),
            });
            let probe = Probes {
                metrics,
                conditions,
                slots: Some(runtime.slots.clone()),
                backlog: Some(backlog),
                publisher: Some(publisher),
                fan_out: Some(inline),
            };
            // The admin key is minted only once the port is ours: a failed start must
            // not print a key and lose it.
            register_admin_key(services.store.as_ref(), config.admin_key.as_deref()).await?;
            run(
                &config,
                listener,
                services,
                probe,
                format!("database {}", db.display()),
                |stop| runtime.run(stop),
            )
            .await?;
            drop(lock);
            Ok(())
        }
        #[cfg(not(feature = "aws"))]
        Backend::Aws { .. } => Err(NO_AWS.into()),
        #[cfg(feature = "aws")]
        Backend::Aws { prefix } => {
            let sdk = sdk_config().await;
            let resources = AwsResources::discover(&sdk, prefix).await?;
            let clients = AwsClients::new(&sdk);
            let mut services = services_on(&clients, &resources, transport, clock);
            services.metrics = metrics.clone();
            services.settings = config.settings.clone();
            let listener = bind(&config).await?;
            register_admin_key(services.store.as_ref(), config.admin_key.as_deref()).await?;
            let emulation = Emulation {
                services: services.clone(),
                resources,
                clients,
            };
            let probe = Probes {
                metrics,
                conditions,
                slots: None,
                backlog: None,
                // The outbox table's stream fans out, as on AWS.
                publisher: None,
                fan_out: None,
            };
            run(
                &config,
                listener,
                services,
                probe,
                format!("aws, prefix {prefix}"),
                |stop| emulation.run(stop),
            )
            .await
        }
    }
}

/// Bind the API's address, naming it and the flag in the error.
async fn bind(config: &ServeConfig) -> Result<tokio::net::TcpListener, BoxError> {
    tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| {
            format!(
                "cannot listen on {}: {e}; choose another address with --listen (or ENTREGA_LISTEN)",
                config.listen
            )
            .into()
        })
}

/// What the API serves beside the shared router: metrics, conditions, the backlog, and
/// the runtime's way to commit a publish (`publisher`, with its fan-out) and its step
/// after a producer outbox's drain commits an event (`fan_out`, awaited: the drain's
/// back-pressure).
struct Probes {
    metrics: Arc<PrometheusMetrics>,
    conditions: Arc<Conditions>,
    /// The embedded worker's slots, for `/metrics`.
    slots: Option<WorkerSlots>,
    backlog: Option<EmbeddedBacklog>,
    publisher: Option<Arc<dyn entrega_http::api::Publisher>>,
    fan_out: Option<Arc<dyn AfterPublish>>,
}

/// The SQLite adapters, with the previous process's unfinished work released (its
/// leases) and repaired (its waiting deliveries without a message, [`crate::restart`]).
pub async fn open_sqlite(
    db: &std::path::Path,
    clock: Arc<dyn Clock>,
    transport: Arc<HttpTransport>,
) -> Result<(Services, SqliteStore), BoxError> {
    let (services, backlog) = open_sqlite_parts(db, Durability::Full, clock, transport).await?;
    Ok((services, backlog.store))
}

/// [`open_sqlite`], handing back the store and the delivery queue together, as the
/// backlog gauge that reads them.
pub async fn open_sqlite_parts(
    db: &std::path::Path,
    durability: Durability,
    clock: Arc<dyn Clock>,
    transport: Arc<HttpTransport>,
) -> Result<(Services, EmbeddedBacklog), BoxError> {
    let db = SqliteDb::open_with(db, durability)
        .map_err(|e| format!("cannot open the database {}: {e}", db.display()))?;
    let store = SqliteStore::new(db.clone(), clock.clone());
    let deliveries = SqliteQueue::open(db.clone(), DELIVERY_QUEUE, clock.clone()).await?;
    deliveries.keep_last_slots(crate::runtime::kept_slots());
    let failures = SqliteQueue::open(db, FAILURE_QUEUE, clock.clone()).await?;
    store.load_outbox_pending().await?;
    let leases = store.release_dead_leases().await?;
    if leases > 0 {
        tracing::info!(leases, "resumed work left by the previous process");
    }
    let backlog = EmbeddedBacklog {
        store: store.clone(),
        deliveries: deliveries.clone(),
    };
    let services = Services {
        store: Arc::new(store),
        deliveries: Arc::new(deliveries.clone()),
        failures: Arc::new(failures),
        scheduler: Arc::new(deliveries.clone()),
        notifier: Arc::new(EmbeddedNotifier::new(None, None).expect("no SMTP to configure")),
        transport,
        clock,
        metrics: Arc::new(NoMetrics),
        backlog: Arc::new(backlog.clone()),
        // The queue already hands out at most an endpoint's cap at once; the slots
        // hold the same cap for the handler, as they do across Lambda invocations,
        // and give the lane's place back with the slot once the request is over.
        slots: Arc::new(LaneSlots::new(deliveries)),
        random: Arc::new(entrega_core::ports::SystemRandom),
        settings: Settings::default(),
    };
    crate::restart::queue_orphaned_deliveries(&services, &backlog.store).await?;
    Ok((services, backlog))
}

/// Serve the API and run the workers until a signal, then stop both: the API stops
/// taking requests and the workers finish their in-flight attempts.
async fn run<W, Fut>(
    config: &ServeConfig,
    listener: tokio::net::TcpListener,
    services: Services,
    probes: Probes,
    data: String,
    workers: W,
) -> Result<(), BoxError>
where
    W: FnOnce(watch::Receiver<bool>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let waiting: Option<Arc<dyn Fn() -> u64 + Send + Sync>> = probes.backlog.clone().map(|b| {
        Arc::new(move || b.snapshot().iter().map(|(_, n)| n).sum::<u64>())
            as Arc<dyn Fn() -> u64 + Send + Sync>
    });
    let state: AppState = App {
        services,
        targets: Arc::new(config.targets.clone()),
        limiter: Some(Arc::new(RateLimiter::new(config.api_rate_limit))),
        conditions: probes.conditions.clone(),
        waiting,
        publisher: probes.publisher.clone(),
    }
    .into();
    // Metrics are this process's own, so they are served beside the shared API.
    let metrics = MetricsRoute {
        metrics: probes.metrics.clone(),
        backlog: probes.backlog.clone(),
        slots: probes.slots.clone(),
        token: config.metrics_token.clone(),
    };
    let metrics_route = axum::Router::new()
        .route("/metrics", axum::routing::get(metrics_handler))
        .with_state((state.clone(), Arc::new(metrics)));
    let app = router(state.clone()).merge(metrics_route);
    let addr = listener.local_addr()?;
    println!("entrega listening on http://{addr} ({data})");
    tracing::info!(%addr, %data, "started");
    let (stop_tx, stop_rx) = watch::channel(false);
    let workers = tokio::spawn(workers(stop_rx.clone()));
    let mut drains = tokio::task::JoinSet::new();
    let names = crate::pg_outbox::names(&config.outboxes);
    for (outbox, name) in config.outboxes.iter().zip(names) {
        tracing::info!(outbox = %name, "draining");
        let drain = crate::pg_outbox::Drain {
            config: outbox.clone(),
            name,
            services: state.services.clone(),
            after_publish: probes.fan_out.clone(),
            conditions: probes.conditions.clone(),
        };
        drains.spawn(drain.run_supervised(stop_rx.clone()));
    }
    let api = tokio::spawn(crate::http_server::serve(
        listener,
        app,
        config.max_connections,
        stop_rx,
    ));
    wait_for_signal().await;
    tracing::info!("stopping: finishing in-flight attempts");
    let _ = stop_tx.send(true);
    api.await?;
    drains.join_all().await;
    workers.await?;
    tracing::info!("stopped");
    Ok(())
}

struct MetricsRoute {
    metrics: Arc<PrometheusMetrics>,
    backlog: Option<EmbeddedBacklog>,
    slots: Option<WorkerSlots>,
    token: Option<String>,
}

/// `GET /metrics`: the admin key or the metrics token, as a bearer token. The
/// exposition names every tenant and endpoint, so it is not public.
async fn metrics_handler(
    axum::extract::State((state, route)): axum::extract::State<(AppState, Arc<MetricsRoute>)>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let bearer = match entrega_http::api::auth::bearer_key(&headers) {
        Ok(bearer) => bearer,
        Err(refused) => return refused.into_response(),
    };
    let allowed = match bearer {
        None => false,
        Some(token)
            if route
                .token
                .as_deref()
                .is_some_and(|t| constant_eq(t, token)) =>
        {
            true
        }
        Some(key) => matches!(
            state
                .services
                .store
                .principal_for_key(&hash_api_key(key))
                .await,
            Ok(Some(Principal::Admin))
        ),
    };
    if !allowed {
        return entrega_http::api::problem::ApiError::unauthorized().into_response();
    }
    let backlog = route
        .backlog
        .as_ref()
        .map(EmbeddedBacklog::snapshot)
        .unwrap_or_default();
    if let Some(slots) = &route.slots {
        let (worker, slow) = slots.in_use();
        route.metrics.slots_in_use(worker, slow);
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        route.metrics.render(&backlog),
    )
        .into_response()
}

/// Compare secrets in time independent of where they differ.
fn constant_eq(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

/// The admin key from the environment, or on first start a generated one, printed
/// once. Only its hash is stored.
async fn register_admin_key(store: &dyn TenantStore, key: Option<&str>) -> Result<(), BoxError> {
    match key {
        Some(key) if key.len() < MIN_ADMIN_KEY_LEN => {
            Err(format!("ENTREGA_ADMIN_KEY must be at least {MIN_ADMIN_KEY_LEN} characters").into())
        }
        Some(key) => Ok(store
            .put_api_key(&hash_api_key(key), &Principal::Admin)
            .await?),
        None if store.has_admin_key().await? => Ok(()),
        None => {
            let key = mint_admin_key(store).await?;
            println!("admin API key (shown once, store it now): {key}");
            Ok(())
        }
    }
}

/// A new admin key, registered by its hash; the key itself is returned to show once.
pub async fn mint_admin_key(store: &dyn TenantStore) -> Result<String, BoxError> {
    let key = generate_api_key();
    store
        .put_api_key(&hash_api_key(&key), &Principal::Admin)
        .await?;
    Ok(key)
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing a SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
