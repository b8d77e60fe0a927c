//! `entrega serve`: wire a backend's adapters, the transport, the workers and the API
//! router into one process, and stop it cleanly. The SQLite backend runs the
//! in-process runtime; the AWS backend runs the Lambda functions' handlers fed by
//! local pollers (Lambda's event source mappings, played here).

use std::fs::File;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use entrega_aws::emulation::Emulation;
use entrega_aws::resources::{aws_services, sdk_config, AwsResources};
use entrega_core::ports::{
    Clock, NoMetrics, Notifier, Services, Settings, SystemClock, TenantStore,
};
use entrega_core::tenant::{generate_api_key, hash_api_key, Principal};
use entrega_http::api::rate_limit::RateLimiter;
use entrega_http::api::{router, AppState};
use entrega_http::transport::{HttpTransport, TargetPolicy};
use tokio::sync::watch;

use crate::metrics::PrometheusMetrics;
use crate::notifier::{AlertWebhook, EmbeddedNotifier, SmtpRelay};
use crate::runtime::Runtime;
use crate::sqlite::queue::{SqliteQueue, DELIVERY_QUEUE, FAILURE_QUEUE};
use crate::sqlite::{SqliteDb, SqliteStore};

/// Shortest admin key accepted from the environment: a short key can be guessed.
pub const MIN_ADMIN_KEY_LEN: usize = 24;

/// Where the data lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    Sqlite {
        db: PathBuf,
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
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Run until SIGINT or SIGTERM.
pub async fn serve(config: ServeConfig) -> Result<(), BoxError> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let transport = Arc::new(HttpTransport::new(config.targets.clone()));
    let metrics = Arc::new(PrometheusMetrics::default());
    let notifier: Arc<dyn Notifier> = Arc::new(EmbeddedNotifier::new(
        config.alert_webhook.clone(),
        config.smtp.clone(),
    )?);
    match &config.backend {
        Backend::Sqlite { db } => {
            let lock = lock_database(db)?;
            let (mut services, store) = open_sqlite(db, clock, transport).await?;
            services.notifier = notifier;
            services.metrics = metrics.clone();
            services.settings = config.settings.clone();
            register_admin_key(services.store.as_ref(), config.admin_key.as_deref()).await?;
            let runtime = Runtime {
                services: services.clone(),
                store,
            };
            run(
                &config,
                services,
                metrics,
                format!("database {}", db.display()),
                |stop| runtime.run(stop),
            )
            .await?;
            drop(lock);
            Ok(())
        }
        Backend::Aws { prefix } => {
            let sdk = sdk_config().await;
            let resources = AwsResources::discover(&sdk, prefix).await?;
            let mut services = aws_services(&sdk, &resources, transport, clock);
            services.metrics = metrics.clone();
            services.settings = config.settings.clone();
            register_admin_key(services.store.as_ref(), config.admin_key.as_deref()).await?;
            let emulation = Emulation {
                services: services.clone(),
                resources,
                sdk,
            };
            run(
                &config,
                services,
                metrics,
                format!("aws, prefix {prefix}"),
                |stop| emulation.run(stop),
            )
            .await
        }
    }
}

/// One process per database: the lock is what makes releasing the previous process's
/// leases at start-up safe. The OS drops it when the process dies, even by `kill -9`.
fn lock_database(db: &std::path::Path) -> Result<File, BoxError> {
    let lock_path = PathBuf::from(format!("{}.lock", db.display()));
    let lock = File::create(&lock_path)?;
    if lock.try_lock().is_err() {
        return Err(format!(
            "another entrega process is using {} (lock {})",
            db.display(),
            lock_path.display()
        )
        .into());
    }
    Ok(lock)
}

/// The SQLite adapters, with the previous process's unfinished work released.
pub async fn open_sqlite(
    db: &std::path::Path,
    clock: Arc<dyn Clock>,
    transport: Arc<HttpTransport>,
) -> Result<(Services, SqliteStore), BoxError> {
    let db = SqliteDb::open(db)?;
    let store = SqliteStore::new(db.clone(), clock.clone());
    let deliveries = SqliteQueue::new(db.clone(), DELIVERY_QUEUE, clock.clone());
    let failures = SqliteQueue::new(db, FAILURE_QUEUE, clock.clone());
    let leases = store.release_dead_leases().await?;
    let released = deliveries.release_in_flight().await? + failures.release_in_flight().await?;
    if leases + released > 0 {
        tracing::info!(
            leases,
            released,
            "resumed work left by the previous process"
        );
    }
    let services = Services {
        store: Arc::new(store.clone()),
        deliveries: Arc::new(deliveries.clone()),
        failures: Arc::new(failures),
        scheduler: Arc::new(deliveries),
        notifier: Arc::new(EmbeddedNotifier::new(None, None).expect("no SMTP to configure")),
        transport,
        clock,
        metrics: Arc::new(NoMetrics),
        settings: Settings::default(),
    };
    Ok((services, store))
}

/// Serve the API and run the workers until a signal, then stop both: the API stops
/// taking requests and the workers finish their in-flight attempts.
async fn run<W, Fut>(
    config: &ServeConfig,
    services: Services,
    metrics: Arc<PrometheusMetrics>,
    data: String,
    workers: W,
) -> Result<(), BoxError>
where
    W: FnOnce(watch::Receiver<bool>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    // Metrics are this process's own, so they are served beside the shared API.
    let metrics_route = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = metrics.clone();
            async move { metrics.render() }
        }),
    );
    let app = router(AppState {
        services,
        targets: Arc::new(config.targets.clone()),
        limiter: Some(Arc::new(RateLimiter::new(config.api_rate_limit))),
    })
    .merge(metrics_route);
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    println!("entrega listening on http://{addr} ({data})");
    tracing::info!(%addr, %data, "started");
    let (stop_tx, stop_rx) = watch::channel(false);
    let workers = tokio::spawn(workers(stop_rx.clone()));
    let mut api_stop = stop_rx;
    let api = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = api_stop.wait_for(|stop| *stop).await;
            })
            .await
    });
    wait_for_signal().await;
    tracing::info!("stopping: finishing in-flight attempts");
    let _ = stop_tx.send(true);
    api.await??;
    workers.await?;
    tracing::info!("stopped");
    Ok(())
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
