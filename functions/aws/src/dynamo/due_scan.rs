//! Young deliveries stay out of the due index; the sweeper indexes the ones still
//! waiting once they are old enough to be overdue.
//!
//! Nearly every delivery is settled within seconds of its creation. Entering the due
//! index when created and leaving it when delivered cost two index writes a delivery
//! (2 of its 11 write units) for a question the sweeper asks only of deliveries
//! waiting longer than its grace. So a delivery written while young ([`is_young`]:
//! its id's time, the event's, less than [`YOUNG_FOR`] ago) is not indexed as
//! waiting, and before each sweep [`DynamoStore::index_left_out`] reads the day
//! partitions (the delivery items themselves, sorted by id and so by time) from a
//! cursor up to the sweeper's cutoff, and indexes what it finds still waiting and
//! unindexed. Each delivery is read there once, with eventually consistent reads of
//! items under 1 KiB: about a tenth of a read unit, for two write units saved.
//!
//! Why nothing waiting is missed: a write that leaves a delivery unindexed happens
//! less than [`YOUNG_FOR`] after the id's time, and the scan reaches an id only
//! [`SWEEP_GRACE`] after it, later than any such write (the gap between the two, ten
//! minutes, covers the lag of an eventually consistent read and the clocks of two
//! functions); a write after that indexes the delivery itself. The cursor moves only
//! past what was read and indexed, and is never moved back. It is made by the first
//! write that leaves a delivery out (and checked again every ten minutes), below that
//! write's young ids, so with no cursor there is nothing to scan. A run is bounded in
//! pages and entries per shard and in time, and it keeps its progress a day at a time.
//!
//! [`SWEEP_GRACE`]: entrega_core::handlers::sweep::SWEEP_GRACE

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use entrega_core::ids::DeliveryId;
use entrega_core::ports::StoreResult;

use super::deliveries::DueWrite;
use super::*;

/// A delivery whose id's time is less than this long ago is written without its due
/// index entry. Ten minutes less than [`SWEEP_GRACE`], the age at which the scan reads
/// it: the margin covers the clocks of two functions and a read's lag.
pub const YOUNG_FOR: ChronoDuration = ChronoDuration::minutes(5);
/// An id's time up to this far ahead of the writer's clock still counts as young (a
/// producer's clock a little fast); further ahead, the delivery is indexed at once,
/// so a lost message does not wait for the scan to reach a far future day.
const YOUNG_AHEAD: ChronoDuration = ChronoDuration::minutes(5);
/// Items one query page reads at most (its `Limit`): only the few still waiting come
/// back (the filter runs in DynamoDB), but a backlog that waits could fill a page,
/// and this bounds what one page holds.
const PAGE_ITEMS: i32 = 500;
/// Pages each shard reads at most in one run: 64 shards × 128 × 500 items are about
/// 4 million deliveries, 13 000 a second between five-minute runs. Each shard has its
/// own share, and all are read side by side, so no shard waits on another's budget.
const PAGES_PER_SHARD: usize = 128;
/// Reading stops this long after a run starts, and entering what it found stops at
/// [`RUN_TIME`]: the sweeper's function has 30 s, and its own work comes after.
const READ_TIME: std::time::Duration = std::time::Duration::from_secs(8);
const RUN_TIME: std::time::Duration = std::time::Duration::from_secs(16);
/// Waiting deliveries one run enters at most from one shard (32 768 in all): bounds a
/// run's memory and writes behind a backlog that waits (a dead endpoint receiving 100
/// events a second leaves 30 000 waiting every five minutes); the next run goes on
/// from the last one entered. [`DynamoStore::with_left_out_per_shard`] changes it
/// (tests reach the bound with a few deliveries).
pub const LEFT_OUT_PER_SHARD: usize = 512;
/// Index writes sent at once (each an UpdateItem of its own, spread over the 64 day
/// shards' partitions).
const INDEX_AT_ONCE: usize = 64;
/// How often a process makes sure again that the cursor exists (one conditional
/// write): a cursor deleted by hand is made again within this.
const CURSOR_CHECK_EVERY: ChronoDuration = ChronoDuration::minutes(10);
/// Milliseconds in a (UTC) day partition.
const DAY_MS: i64 = 86_400_000;

/// Whether a delivery written at `now` is left out of the due index.
pub fn is_young(id: &DeliveryId, now: DateTime<Utc>) -> bool {
    let age_ms = now.timestamp_millis() - id.timestamp_ms();
    age_ms < YOUNG_FOR.num_milliseconds() && -age_ms <= YOUNG_AHEAD.num_milliseconds()
}

/// What the scan of one shard found.
struct ShardScan {
    /// Waiting deliveries with no due index entry.
    left_out: Vec<Item>,
    /// Where the scan stopped before the shard's end (its budget ran out): the last
    /// key read, or where it was to start if it read nothing.
    stopped_at: Option<String>,
    /// Pages read.
    pages: usize,
}

/// What one shard may still do in this run.
#[derive(Clone, Copy)]
struct ShardBudget {
    pages: usize,
    left_out: usize,
}

impl DynamoStore {
    /// This store, its sweeper's scan entering at most `n` waiting deliveries of one
    /// shard a run (at least 2, so that one it cannot enter never holds the cursor).
    pub fn with_left_out_per_shard(mut self, n: usize) -> Self {
        self.left_out_per_shard = n.max(2);
        self
    }

    /// Index every waiting delivery left out of the due index whose id's time is
    /// before `before` (and before this store's clock less [`SWEEP_GRACE`], so that no
    /// write leaving one out can come after), from the stored cursor on, a day at a
    /// time; after each day, move the cursor, so a run cut short keeps its progress.
    /// Every shard of a day is read side by side with a budget of its own; the cursor
    /// moves to where the one that got least far stopped.
    pub(super) async fn index_left_out(&self, before: DateTime<Utc>) -> StoreResult<()> {
        let started = std::time::Instant::now();
        let latest = self.clock.now() - entrega_core::handlers::sweep::SWEEP_GRACE;
        let end = keys::delivery_ids_of_ms(before.min(latest).timestamp_millis());
        // No cursor: no delivery was ever written unindexed (the first such write
        // makes it), so there is nothing to scan.
        let Some(mut cursor) = self.scan_cursor().await? else {
            return Ok(());
        };
        let mut budgets = vec![
            ShardBudget {
                pages: PAGES_PER_SHARD,
                left_out: self.left_out_per_shard,
            };
            usize::from(keys::DAY_SHARDS)
        ];
        while cursor < end && started.elapsed() < READ_TIME {
            let day_ms = keys::ms_of_delivery_key(&cursor).unwrap_or_default();
            let day = keys::day(day_ms);
            let next_day = keys::delivery_ids_of_ms((day_ms.div_euclid(DAY_MS) + 1) * DAY_MS);
            let day_end = next_day.min(end.clone());
            let scans = budgets.iter().enumerate().map(|(shard, budget)| {
                let pk = keys::sharded(&day, shard as u8);
                self.scan_shard(pk, &cursor, &end, *budget, started + READ_TIME)
            });
            let scanned = futures_util::future::join_all(scans).await;
            let mut reached = day_end.clone();
            let mut left_out = Vec::new();
            for (budget, scan) in budgets.iter_mut().zip(scanned) {
                let scan = scan?;
                budget.pages -= scan.pages;
                budget.left_out -= scan.left_out.len();
                left_out.extend(scan.left_out);
                if let Some(at) = scan.stopped_at {
                    reached = reached.min(at);
                }
            }
            if let Some(first_not_entered) =
                self.index_in_order(left_out, started + RUN_TIME).await?
            {
                reached = reached.min(first_not_entered);
            }
            self.move_scan_cursor(&cursor, &reached).await?;
            if reached < day_end {
                // Stopped within the day: the next run goes on from there.
                break;
            }
            cursor = reached;
        }
        Ok(())
    }

    /// Enter `left_out` in the due index in key order, until `deadline`: the key of the
    /// first one not entered, if time ran out (everything below it is entered).
    async fn index_in_order(
        &self,
        mut left_out: Vec<Item>,
        deadline: std::time::Instant,
    ) -> StoreResult<Option<String>> {
        left_out.sort_by(|a, b| get_s(a, SK).cmp(&get_s(b, SK)));
        for chunk in left_out.chunks(INDEX_AT_ONCE) {
            if std::time::Instant::now() >= deadline {
                return Ok(chunk.first().and_then(|i| get_s(i, SK)).map(str::to_owned));
            }
            let writes = chunk.iter().map(|item| self.index_as_waiting(item));
            for written in futures_util::future::join_all(writes).await {
                written?;
            }
        }
        Ok(None)
    }

    /// One shard of one day from `from` to `end`, within `budget` and until
    /// `deadline`: the waiting deliveries without a due index entry (settled ones
    /// carry their TTL, paused ones their paused entry).
    async fn scan_shard(
        &self,
        pk: String,
        from: &str,
        end: &str,
        budget: ShardBudget,
        deadline: std::time::Instant,
    ) -> StoreResult<ShardScan> {
        let mut scan = ShardScan {
            left_out: Vec::new(),
            stopped_at: Some(from.to_owned()),
            pages: 0,
        };
        let mut start: Option<Item> = None;
        while scan.pages < budget.pages
            && budget.left_out > 0
            && std::time::Instant::now() < deadline
        {
            scan.pages += 1;
            let out = self
                .client
                .query()
                .table_name(&self.main_table)
                .key_condition_expression("#pk = :pk AND #sk BETWEEN :from AND :end")
                .filter_expression("attribute_not_exists(#ttl) AND attribute_not_exists(#due)")
                .expression_attribute_names("#pk", PK)
                .expression_attribute_names("#sk", SK)
                .expression_attribute_names("#ttl", TTL_ATTRIBUTE)
                .expression_attribute_names("#due", keys::BY_DUE.pk)
                .expression_attribute_values(":pk", s(pk.clone()))
                .expression_attribute_values(":from", s(from))
                .expression_attribute_values(":end", s(end))
                .limit(PAGE_ITEMS)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(backend)?;
            scan.left_out.extend(out.items().iter().cloned());
            if scan.left_out.len() >= budget.left_out {
                // Enough for one run: the next goes on from the last one kept (read
                // again there, it is indexed by then, so the filter leaves it out).
                scan.left_out.truncate(budget.left_out);
                scan.stopped_at = scan
                    .left_out
                    .last()
                    .and_then(|i| get_s(i, SK))
                    .map(str::to_owned);
                return Ok(scan);
            }
            match out.last_evaluated_key() {
                Some(last) => {
                    scan.stopped_at = get_s(last, SK).map(str::to_owned);
                    start = Some(last.clone());
                }
                None => {
                    scan.stopped_at = None;
                    return Ok(scan);
                }
            }
        }
        Ok(scan)
    }

    /// Give a delivery found waiting its due index entry, on the version read: a write
    /// since then decided its own entry.
    async fn index_as_waiting(&self, item: &Item) -> StoreResult<()> {
        let delivery: entrega_core::delivery::Delivery = match from_json(item) {
            Ok(delivery) => delivery,
            Err(e) => {
                // One unreadable item must not stop every later run: it is left out
                // (nothing could deliver it either) and said so.
                tracing::error!(error = %e, key = ?get_s(item, SK), "a delivery item the sweeper's scan cannot read");
                return Ok(());
            }
        };
        let Some(due) = delivery.due_at() else {
            return Ok(());
        };
        self.write_due_entry(&delivery, due, DueWrite::Enter).await
    }

    /// Before a process writes a delivery without its due index entry: make sure the
    /// scan's cursor exists (once per [`CURSOR_CHECK_EVERY`]). A new one starts at the
    /// start of the day before: below every id a write can leave out from now on (a
    /// young one's time is at most [`YOUNG_FOR`] before now), with a day to spare for
    /// another function's clock or a write delayed in flight. A cursor, once set, only
    /// follows the cutoff, which stays behind every young id.
    pub(super) async fn before_unindexed_write(&self, now: DateTime<Utc>) -> StoreResult<()> {
        use std::sync::atomic::Ordering;
        let checked_ms = self.scan_cursor_checked_ms.load(Ordering::Relaxed);
        if checked_ms > 0
            && now.timestamp_millis() - checked_ms < CURSOR_CHECK_EVERY.num_milliseconds()
        {
            return Ok(());
        }
        let floor_ms = (now.timestamp_millis().div_euclid(DAY_MS) - 1) * DAY_MS;
        self.set_scan_cursor(
            &keys::delivery_ids_of_ms(floor_ms),
            "attribute_not_exists(#c)",
        )
        .await?;
        self.scan_cursor_checked_ms
            .store(now.timestamp_millis(), Ordering::Relaxed);
        Ok(())
    }

    async fn scan_cursor(&self) -> StoreResult<Option<String>> {
        Ok(self
            .get_main(keys::DUE_SCAN_CURSOR.to_owned())
            .await?
            .and_then(|item| get_s(&item, "cursor").map(str::to_owned)))
    }

    /// Move the cursor from `read` to `to`, only forward: two sweeps at once (a slow
    /// run overlapping the next) leave the further of the two.
    async fn move_scan_cursor(&self, read: &str, to: &str) -> StoreResult<()> {
        if to <= read {
            return Ok(());
        }
        self.set_scan_cursor(to, "attribute_not_exists(#c) OR #c < :to")
            .await
    }

    /// Set the cursor to `to` where `condition` holds (`#c` the cursor, `:to` the new
    /// value); a condition that fails is an answer, not an error.
    async fn set_scan_cursor(&self, to: &str, condition: &str) -> StoreResult<()> {
        let set = self
            .client
            .update_item()
            .table_name(&self.main_table)
            .set_key(Some(key(keys::DUE_SCAN_CURSOR.to_owned())))
            .update_expression("SET #c = :to")
            .condition_expression(condition)
            .expression_attribute_names("#c", "cursor")
            .expression_attribute_values(":to", s(to))
            .send()
            .await;
        match set {
            Ok(_) => Ok(()),
            Err(e) if is_condition_failure(&e) => Ok(()),
            Err(e) => Err(backend(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use entrega_core::handlers::sweep::SWEEP_GRACE;
    use entrega_core::ids::{EndpointId, EventId};

    #[test]
    fn the_scan_reaches_an_id_only_after_every_write_that_leaves_it_out() {
        // The margin between the two covers read lag and clock skew.
        assert!(SWEEP_GRACE - YOUNG_FOR >= ChronoDuration::minutes(10));
    }

    #[test]
    fn young_is_the_ids_time_within_the_window_around_now() {
        let now = Utc::now();
        let id_at = |at: DateTime<Utc>| {
            DeliveryId::for_event(
                &EventId::generate(),
                &EndpointId::generate(),
                at.timestamp_millis(),
            )
        };
        assert!(is_young(&id_at(now), now));
        assert!(is_young(&id_at(now - ChronoDuration::minutes(4)), now));
        assert!(!is_young(&id_at(now - ChronoDuration::minutes(5)), now));
        assert!(is_young(&id_at(now + ChronoDuration::minutes(5)), now));
        assert!(!is_young(&id_at(now + ChronoDuration::minutes(6)), now));
    }
}
