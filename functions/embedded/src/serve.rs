//! `entrega serve`: wire the SQLite adapters, the transport, the runtime and the API
//! router into one process, and stop it cleanly.

use std::fs::File;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use entrega_core::ports::{Clock, Services, SystemClock};
use entrega_core::tenant::{generate_api_key, hash_api_key, Principal};
use entrega_http::api::{router, AppState};
use entrega_http::transport::{HttpTransport, TargetPolicy};
use tokio::sync::watch;

use crate::notifier::LogNotifier;
use crate::runtime::{Runtime, RuntimeConfig};
use crate::sqlite::queue::{SqliteQueue, DELIVERY_QUEUE, FAILURE_QUEUE};
use crate::sqlite::{SqliteDb, SqliteStore};

/// Shortest admin key accepted from the environment: a short key can be guessed.
pub const MIN_ADMIN_KEY_LEN: usize = 24;

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub db: PathBuf,
    pub targets: TargetPolicy,
    pub admin_key: Option<String>,
    pub alert_threshold: u64,
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Run until SIGINT or SIGTERM.
pub async fn serve(config: ServeConfig) -> Result<(), BoxError> {
    // One process per database: the lock is what makes releasing the previous
    // process's leases at start-up safe. The OS drops it when the process dies.
    let lock_path = PathBuf::from(format!("{}.lock", config.db.display()));
    let lock = File::create(&lock_path)?;
    if lock.try_lock().is_err() {
        return Err(format!(
            "another entrega process is using {} (lock {})",
            config.db.display(),
            lock_path.display()
        )
        .into());
    }

    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let db = SqliteDb::open(&config.db)?;
    let store = SqliteStore::new(db.clone(), clock.clone());
    let deliveries = SqliteQueue::new(db.clone(), DELIVERY_QUEUE, clock.clone());
    let failures = SqliteQueue::new(db.clone(), FAILURE_QUEUE, clock.clone());
    let leases = store.release_dead_leases().await?;
    let released = deliveries.release_in_flight().await? + failures.release_in_flight().await?;
    if leases + released > 0 {
        tracing::info!(
            leases,
            released,
            "resumed work left by the previous process"
        );
    }
    register_admin_key(&store, config.admin_key.as_deref()).await?;

    let services = Services {
        store: Arc::new(store.clone()),
        deliveries: Arc::new(deliveries.clone()),
        failures: Arc::new(failures),
        scheduler: Arc::new(deliveries),
        notifier: Arc::new(LogNotifier),
        transport: Arc::new(HttpTransport::new(config.targets.clone())),
        clock,
    };
    let app = router(AppState {
        services: services.clone(),
        targets: Arc::new(config.targets.clone()),
    });
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    println!(
        "entrega listening on http://{addr} (database {})",
        config.db.display()
    );
    tracing::info!(%addr, db = %config.db.display(), "started");

    let (stop_tx, stop_rx) = watch::channel(false);
    let runtime = Runtime {
        services,
        store,
        config: RuntimeConfig {
            alert_threshold: config.alert_threshold,
        },
    };
    let workers = tokio::spawn(runtime.run(stop_rx.clone()));
    let mut api_stop = stop_rx.clone();
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
    drop(lock);
    Ok(())
}

/// The admin key from the environment, or on first start a generated one, printed
/// once. Only its hash is stored.
async fn register_admin_key(store: &SqliteStore, key: Option<&str>) -> Result<(), BoxError> {
    use entrega_core::ports::TenantStore;
    match key {
        Some(key) if key.len() < MIN_ADMIN_KEY_LEN => {
            Err(format!("ENTREGA_ADMIN_KEY must be at least {MIN_ADMIN_KEY_LEN} characters").into())
        }
        Some(key) => Ok(store
            .put_api_key(&hash_api_key(key), &Principal::Admin)
            .await?),
        None if store.admin_key_exists().await? => Ok(()),
        None => {
            let key = generate_api_key();
            store
                .put_api_key(&hash_api_key(&key), &Principal::Admin)
                .await?;
            println!("admin API key (shown once, store it now): {key}");
            Ok(())
        }
    }
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
