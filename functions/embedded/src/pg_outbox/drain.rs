//! Draining one producer outbox into Entrega's store.
//!
//! Each batch is one PostgreSQL transaction: lock up to [`DRAIN_BATCH`] of the oldest
//! rows with `FOR UPDATE SKIP LOCKED` (a second drain, in this process or another,
//! takes the next rows instead of waiting or taking the same ones), commit each row's
//! event into Entrega's store, and only then delete the rows (moving the bad ones to
//! quarantine) and commit. A crash before that commit leaves the rows in place, to be
//! drained again: publishing is idempotent by event id, so a row never becomes two
//! events. A drain wakes on the insert trigger's `NOTIFY` and polls every
//! [`FALLBACK_POLL`] in case a notification was missed (a reconnect, a restart).
//!
//! A tenant whose backlog is at `max_backlog` gets what the API's 429 gives a
//! publisher: its rows wait in the producer's outbox (skipped by later batches, so
//! they hold up no other tenant) until its backlog is below the limit again.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::fan_out::AfterPublish;
use entrega_core::conditions::{Component, Conditions};
use entrega_core::event::{Event, MAX_PAYLOAD_BYTES};
use entrega_core::ids::TenantId;
use entrega_core::ports::{Published, Services, StoreError};
use entrega_core::producer_outbox::{event_of_row, OutboxRow, QuarantineReason};
use entrega_runtime::{pause, LoopBackoff};
use futures_util::future::join_all;
use futures_util::{stream, StreamExt};
use tokio::sync::{watch, Notify, Semaphore};
use tokio_postgres::{AsyncMessage, Client};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::row_key::{key_columns, RowKey};
use super::schema::{self, CHANNEL};

/// Rows per batch: one transaction, one store group commit, one `DELETE`. Bounded so
/// a batch's locks and memory stay small (at most 500 × 256 KiB payloads).
pub const DRAIN_BATCH: i64 = 500;
/// Payload bytes one batch may take in. With the fan-outs behind it, at most
/// `FAN_OUT_BATCHES_IN_FLIGHT + 1` batches' payloads are in memory (about 80 MiB),
/// whatever size the rows are; the rows past it wait for the next batch.
pub const BATCH_BYTES: i64 = 16 * 1024 * 1024;
/// The longest one batch may take. A database that stops answering mid-batch (a hung
/// host, a half-open connection) would otherwise stall the drain silently: past this,
/// the connection is dropped (PostgreSQL rolls the batch back) and the drain reports
/// the condition and reconnects.
pub const BATCH_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest a committed row waits when its notification was missed.
pub const FALLBACK_POLL: Duration = Duration::from_secs(1);
/// How often a connected drain checks the table's contract again (one catalog query):
/// a table changed under it (its payload made `json`, its version comment changed) was
/// drained by the old rules until the next reconnect.
pub const CONTRACT_RECHECK: Duration = Duration::from_secs(10);
/// Fan-outs of freshly published events run this many at once.
const FAN_OUT_CONCURRENCY: usize = 64;
/// Batches whose fan-out may still run while the drain goes on. The drain does not
/// wait for fan-outs (the events are durable in the store already), but past this it
/// does: fan-out is the back-pressure, and its backlog stays under the outbox
/// poller's grace, so the poller never fans the same events out beside it.
const FAN_OUT_BATCHES_IN_FLIGHT: usize = 4;

/// Why a batch did not drain.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// The producer's database: the rows stay where they are.
    #[error("{}", super::error_text(.0))]
    Postgres(#[from] tokio_postgres::Error),
    /// The outbox table is missing or of another contract version.
    #[error("{0}")]
    Contract(String),
    /// Entrega's own store: the batch is rolled back in PostgreSQL and retried.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The batch took longer than [`BATCH_TIMEOUT`]; the connection is dropped.
    #[error("a batch took longer than {0:?}; reconnecting")]
    Timeout(Duration),
    /// Connecting failed or took longer than [`super::CONNECT_TIMEOUT`].
    #[error("{0}")]
    Connect(String),
}

/// One drain of one outbox. Several may run against the same table.
#[derive(Clone)]
pub struct Drain {
    pub config: tokio_postgres::Config,
    /// How `/healthz` and the log name it (see [`super::names`]).
    pub name: String,
    pub services: Services,
    /// The embedded runtime fans a new event out at once; `None` where the store's
    /// own outbox does it (the AWS backend's stream).
    pub after_publish: Option<Arc<dyn AfterPublish>>,
    pub conditions: Arc<Conditions>,
}

/// What one batch did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Drained {
    pub events: usize,
    pub quarantined: usize,
    /// Rows left in the outbox because their tenant's backlog is full.
    pub held: usize,
    /// Rows left for the next batch because this one had [`BATCH_BYTES`] already.
    pub deferred: usize,
}

/// What the rows of a batch are to become.
#[derive(Default)]
struct Screened {
    events: Vec<(RowKey, Event)>,
    bad: Vec<(RowKey, QuarantineReason)>,
    /// Rows of tenants whose backlog is full: left where they are.
    held: HashSet<RowKey>,
}

impl Drained {
    fn rows(&self) -> usize {
        self.events + self.quarantined
    }
}

impl Drain {
    /// Drain until `shutdown` turns true. A failing database or store is reported in
    /// `/healthz` and retried with backoff; nothing is lost meanwhile (the rows wait).
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let name = self.name.clone();
        let tls = super::tls::connector();
        let wake = Arc::new(Notify::new());
        // Room for fan-outs running behind the drain.
        let room = Arc::new(Semaphore::new(FAN_OUT_BATCHES_IN_FLIGHT));
        let mut full = HashSet::new();
        let mut backoff = LoopBackoff::default();
        let mut client: Option<Client> = None;
        let mut checked = tokio::time::Instant::now();
        while !*shutdown.borrow() {
            let connected = match client.take() {
                Some(c) if !c.is_closed() && checked.elapsed() < CONTRACT_RECHECK => Ok(c),
                Some(c) if !c.is_closed() => {
                    checked = tokio::time::Instant::now();
                    schema::check(&c)
                        .await
                        .map(|()| c)
                        .map_err(DrainError::Contract)
                }
                _ => {
                    checked = tokio::time::Instant::now();
                    self.connect(&tls, wake.clone()).await
                }
            };
            let result = match connected {
                Ok(mut c) => {
                    let batch = self.drain_batch(&mut c, &room, &mut full);
                    match tokio::time::timeout(BATCH_TIMEOUT, batch).await {
                        Ok(r) => {
                            client = Some(c);
                            r
                        }
                        Err(_) => Err(DrainError::Timeout(BATCH_TIMEOUT)),
                    }
                }
                Err(e) => Err(e),
            };
            match result {
                Ok(drained) => {
                    self.conditions
                        .recovered_at(Component::ProducerOutbox, &name);
                    backoff.reset();
                    let more = drained.deferred > 0
                        || drained.rows() + drained.held >= DRAIN_BATCH as usize;
                    if !more {
                        tokio::select! {
                            _ = wake.notified() => {}
                            _ = tokio::time::sleep(FALLBACK_POLL) => {}
                            _ = shutdown.changed() => {}
                        }
                    }
                }
                Err(e) => {
                    self.conditions.failing_at(
                        Component::ProducerOutbox,
                        &name,
                        &format!("{name}: {e}"),
                        self.services.clock.now(),
                    );
                    pause(&mut shutdown, backoff.next_pause()).await;
                }
            }
        }
    }

    /// [`Self::run`], run again after a pause if it panics: a drain that stopped on a
    /// bug (a column it could not read did) left its rows waiting for good while
    /// `/healthz` said all was well. Now `/healthz` says so, and it goes on.
    pub async fn run_supervised(self, mut shutdown: watch::Receiver<bool>) {
        let mut backoff = LoopBackoff::default();
        loop {
            let Err(stopped) = tokio::spawn(self.clone().run(shutdown.clone())).await else {
                return;
            };
            let why = format!(
                "{}: the drain stopped ({stopped}); restarting it",
                self.name
            );
            tracing::error!(outbox = %self.name, reason = %why, "outbox drain stopped");
            self.conditions.failing_at(
                Component::ProducerOutbox,
                &self.name,
                &why,
                self.services.clock.now(),
            );
            pause(&mut shutdown, backoff.next_pause()).await;
            if *shutdown.borrow() {
                return;
            }
        }
    }

    /// Connect, check the table's contract, and listen: the connection's task turns
    /// each notification into a wake-up.
    async fn connect(
        &self,
        tls: &MakeRustlsConnect,
        wake: Arc<Notify>,
    ) -> Result<Client, DrainError> {
        let (client, mut connection) =
            super::connect(&self.config, tls.clone(), "entrega-outbox-drain")
                .await
                .map_err(DrainError::Connect)?;
        tokio::spawn(async move {
            let mut messages = stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(_) = message {
                    wake.notify_one();
                }
            }
        });
        let ready = async {
            schema::check(&client).await.map_err(DrainError::Contract)?;
            client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
            Ok::<_, DrainError>(())
        };
        match tokio::time::timeout(super::CONNECT_TIMEOUT, ready).await {
            Ok(ready) => ready?,
            Err(_) => return Err(DrainError::Timeout(super::CONNECT_TIMEOUT)),
        }
        Ok(client)
    }

    /// Drain one batch of the oldest unlocked rows of tenants not in `full` (whose
    /// backlog was full; updated here); their fan-out goes on behind, within `room`.
    pub async fn drain_batch(
        &self,
        client: &mut Client,
        room: &Arc<Semaphore>,
        full: &mut HashSet<TenantId>,
    ) -> Result<Drained, DrainError> {
        let mut still_full = HashSet::new();
        for tenant in full.drain() {
            if self.backlog_full(&tenant).await? {
                still_full.insert(tenant);
            }
        }
        *full = still_full;
        let skipped: Vec<String> = full.iter().map(TenantId::to_string).collect();
        let tx = client.transaction().await?;
        // Lock the batch and learn its sizes first; then fetch payloads only up to
        // BATCH_BYTES, and never one over MAX_PAYLOAD_BYTES (it is only quarantined).
        // Read as text, so a `uuid` or `varchar` id or type drains as well.
        let locked = tx
            .query(
                "SELECT id::text, tenant_id::text, type::text, octet_length(payload::text)
                   FROM entrega_outbox
                  WHERE NOT (tenant_id::text = ANY($2::text[]))
                  ORDER BY created_at, id
                  LIMIT $1
                    FOR UPDATE SKIP LOCKED",
                &[&DRAIN_BATCH, &skipped],
            )
            .await?;
        if locked.is_empty() {
            return Ok(Drained::default());
        }
        let mut budget = BATCH_BYTES;
        let mut rows = Vec::new();
        let mut wanted: Vec<RowKey> = Vec::new();
        for r in &locked {
            let size = i64::from(r.try_get::<_, i32>(3)?);
            let fetched = size <= MAX_PAYLOAD_BYTES as i64;
            if fetched && size > budget && !rows.is_empty() {
                break;
            }
            let row = OutboxRow {
                id: r.try_get(0)?,
                tenant_id: r.try_get(1)?,
                event_type: r.try_get(2)?,
                payload: None,
            };
            if fetched {
                budget -= size;
                wanted.push(RowKey::of(&row));
            }
            rows.push(row);
        }
        let deferred = locked.len() - rows.len();
        let (tenants, ids) = key_columns(wanted.iter());
        let mut payloads: HashMap<RowKey, String> = HashMap::new();
        for r in tx
            .query(
                "SELECT o.tenant_id::text, o.id::text, o.payload::text
                   FROM entrega_outbox o
                   JOIN unnest($1::text[], $2::text[]) AS w(tenant_id, id)
                     ON o.tenant_id::text = w.tenant_id AND o.id::text = w.id",
                &[&tenants, &ids],
            )
            .await?
        {
            let key = RowKey {
                tenant_id: r.try_get(0)?,
                id: r.try_get(1)?,
            };
            payloads.insert(key, r.try_get(2)?);
        }
        for row in &mut rows {
            row.payload = payloads.remove(&RowKey::of(row));
        }
        let Screened {
            events,
            mut bad,
            held,
        } = self.screen(&rows, full).await?;
        let created = self.publish_all(&events, &mut bad).await?;

        let done: Vec<RowKey> = rows
            .iter()
            .map(RowKey::of)
            .filter(|key| !held.contains(key))
            .collect();
        if !bad.is_empty() {
            let (tenants, ids) = key_columns(bad.iter().map(|(key, _)| key));
            let reasons: Vec<&str> = bad.iter().map(|(_, r)| r.as_str()).collect();
            tx.execute(
                "INSERT INTO entrega_outbox_quarantine
                        (id, tenant_id, type, payload, created_at, reason)
                 SELECT o.id::text, o.tenant_id::text, o.type::text, o.payload, o.created_at,
                        q.reason
                   FROM entrega_outbox o
                   JOIN unnest($1::text[], $2::text[], $3::text[]) AS q(tenant_id, id, reason)
                     ON o.tenant_id::text = q.tenant_id AND o.id::text = q.id",
                &[&tenants, &ids, &reasons],
            )
            .await?;
        }
        let (tenants, ids) = key_columns(done.iter());
        tx.execute(
            "DELETE FROM entrega_outbox o
              USING unnest($1::text[], $2::text[]) AS d(tenant_id, id)
              WHERE o.tenant_id::text = d.tenant_id AND o.id::text = d.id",
            &[&tenants, &ids],
        )
        .await?;
        tx.commit().await?;

        let drained = Drained {
            events: done.len() - bad.len(),
            quarantined: bad.len(),
            held: held.len(),
            deferred,
        };
        self.services
            .metrics
            .producer_outbox_drained(drained.events as u64);
        for (key, reason) in &bad {
            tracing::warn!(row_id = %key.id, tenant_id = %key.tenant_id, reason = reason.as_str(), "outbox row quarantined");
            self.services.metrics.producer_outbox_quarantined(*reason);
        }
        self.fan_out(created, room).await;
        Ok(drained)
    }

    /// How many more events `tenant` may have accepted now: what `--max-backlog` leaves
    /// of it (0: full).
    async fn backlog_room(&self, tenant: &TenantId) -> Result<u64, StoreError> {
        let waiting = self.services.backlog.tenant_backlog(tenant).await?;
        Ok(self.services.settings.max_backlog.saturating_sub(waiting))
    }

    async fn backlog_full(&self, tenant: &TenantId) -> Result<bool, StoreError> {
        Ok(self.backlog_room(tenant).await? == 0)
    }

    /// Rows that can become events, the others with why not, and those to leave
    /// because their tenant's backlog is full (the tenant is added to `full`). A
    /// tenant takes no more of a batch than its backlog has room for, as if each row
    /// were a `POST /v1/events` checked against the limit.
    async fn screen(
        &self,
        rows: &[OutboxRow],
        full: &mut HashSet<TenantId>,
    ) -> Result<Screened, StoreError> {
        /// What a tenant is to this batch: unknown, or how many more of its rows fit.
        enum Owner {
            Unknown,
            Room(u64),
        }
        let mut owners: HashMap<TenantId, Owner> = HashMap::new();
        let mut screened = Screened::default();
        let (store, now) = (&self.services.store, self.services.clock.now());
        for row in rows {
            let event = match event_of_row(row, now) {
                Ok(event) => event,
                Err(reason) => {
                    screened.bad.push((RowKey::of(row), reason));
                    continue;
                }
            };
            if !owners.contains_key(&event.tenant_id) {
                let owner = if store.get_tenant(&event.tenant_id).await?.is_none() {
                    Owner::Unknown
                } else {
                    Owner::Room(self.backlog_room(&event.tenant_id).await?)
                };
                owners.insert(event.tenant_id.clone(), owner);
            }
            match owners.get_mut(&event.tenant_id).expect("inserted above") {
                Owner::Unknown => screened
                    .bad
                    .push((RowKey::of(row), QuarantineReason::UnknownTenant)),
                Owner::Room(0) => {
                    full.insert(event.tenant_id.clone());
                    screened.held.insert(RowKey::of(row));
                }
                Owner::Room(room) => {
                    *room -= 1;
                    screened.events.push((RowKey::of(row), event));
                }
            }
        }
        Ok(screened)
    }

    /// Commit every event into the store, all at once so the store can group them
    /// into few commits. An id already published with other content is bad; any
    /// store error fails the batch (the PostgreSQL transaction rolls back, so the
    /// rows are drained again and the events already committed are found as
    /// duplicates). Returns the events this call created.
    async fn publish_all(
        &self,
        events: &[(RowKey, Event)],
        bad: &mut Vec<(RowKey, QuarantineReason)>,
    ) -> Result<Vec<Event>, StoreError> {
        let store = &self.services.store;
        let results = join_all(events.iter().map(|(_, e)| store.publish(e))).await;
        let mut created = Vec::new();
        for ((key, event), result) in events.iter().zip(results) {
            match result? {
                Published::Created => created.push(event.clone()),
                Published::Existing(stored) if stored.same_as(event) => {}
                Published::Existing(_) => {
                    bad.push((key.clone(), QuarantineReason::IdReused));
                }
            }
        }
        Ok(created)
    }

    /// Fan the new events out now, behind the drain (the embedded runtime); if this
    /// fails or the process dies first, the store's own outbox poller does it.
    async fn fan_out(&self, created: Vec<Event>, room: &Arc<Semaphore>) {
        let Some(next) = self.after_publish.clone() else {
            return;
        };
        let Ok(permit) = room.clone().acquire_owned().await else {
            return;
        };
        tokio::spawn(async move {
            stream::iter(created)
                .for_each_concurrent(FAN_OUT_CONCURRENCY, |event| {
                    let next = next.clone();
                    async move { next.published(&event).await }
                })
                .await;
            drop(permit);
        });
    }
}
