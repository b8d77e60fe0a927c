//! Every key the DynamoDB store writes or reads, built in one place: a partition or
//! sort key is never spelled out anywhere else, so two files cannot disagree on one.
//!
//! Base-table items are single records under `pk` (sort key [`super::ONLY`]), except
//! deliveries, which sit in their day's log partition sorted by id ([`delivery`]), and
//! a delivery's attempts, which share a partition of their own. The five GSIs are
//! generic and KEYS_ONLY: an index answers "which items, in what order"; the items
//! themselves are read from the table ([`super::DynamoStore::fetch_items`]), so a
//! state change never rewrites an index copy.

use chrono::{TimeZone, Utc};
use entrega_core::delivery::Attempt;
use entrega_core::event::format_timestamp;
use entrega_core::ids::{DeliveryId, EndpointId, FailureId, TenantId};
use entrega_core::slots::SlotPool;

/// One GSI: its name and key attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gsi {
    pub name: &'static str,
    pub pk: &'static str,
    pub sk: &'static str,
}

/// By owner: a tenant's deliveries, endpoints, failures.
pub const BY_TENANT: Gsi = Gsi {
    name: "gsi1",
    pk: "gsi1pk",
    sk: "gsi1sk",
};
/// By endpoint: an endpoint's deliveries and its attempts by time.
pub const BY_ENDPOINT: Gsi = Gsi {
    name: "gsi2",
    pk: "gsi2pk",
    sk: "gsi2sk",
};
/// Admin listings: every tenant, endpoint and failure.
pub const BY_KIND: Gsi = Gsi {
    name: "gsi3",
    pk: "gsi3pk",
    sk: "gsi3sk",
};
/// By parent: a delivery's failures.
pub const BY_PARENT: Gsi = Gsi {
    name: "gsi4",
    pk: "gsi4pk",
    sk: "gsi4sk",
};
/// By due time: the waiting deliveries, for the sweeper (sparse: an item leaves it when
/// it stops waiting); and, in partitions of their own, each endpoint's paused ones.
pub const BY_DUE: Gsi = Gsi {
    name: "gsi5",
    pk: "gsi5pk",
    sk: "gsi5sk",
};
pub const ALL_GSIS: [Gsi; 5] = [BY_TENANT, BY_ENDPOINT, BY_KIND, BY_PARENT, BY_DUE];

// Write shards. A partition accepts about 1 000 write units a second; an index entry
// is one unit, so a partition written for every delivery is split where one source
// can pass that: the day log by all tenants together (below), and a
// tenant's or an endpoint's log by one busy sender (1 000/s → 250/s a shard).

/// Shards of the day log. Its partitions hold the delivery items themselves (the
/// admin's all-tenant log is the table, not an index), so every write of a delivery
/// lands there: created, started, finished, three units per first attempt. At 10 000
/// deliveries a second that is 30 000 units over 64 shards, about 470 a shard.
pub const DAY_SHARDS: u8 = 64;
/// Shards of one tenant's and one endpoint's delivery and attempt logs.
pub const OWNER_SHARDS: u8 = 4;
/// Shards of one tenant's backlog counter (one update per Lambda batch and tenant at
/// fan-out and at the worker: at most two per delivery, far fewer in full batches).
pub const BACKLOG_SHARDS: u8 = 4;
/// Shards of the due index. A delivery still waiting after its first minutes enters
/// it and leaves it (one settled while young never does, [`super::due_scan`]): at
/// 10 000 a second all waiting, 20 000 index writes a second, about 310 a shard.
pub const DUE_SHARDS: u8 = 64;
/// The due index sorts by due time cut to this many minutes, not the exact time: a
/// delivery's entry then moves only when a retry is due in another slot, not on every
/// state change (a move is two index writes). The sweeper reads whole slots that ended
/// before its cutoff, so it acts at most this much later than its grace.
pub const DUE_SLOT_MINUTES: i64 = 10;

/// The shard an id is written to: stable, so every write of one item lands in the
/// same partition, and spread evenly (FNV-1a over the id's bytes).
pub fn shard(id: &str, shards: u8) -> u8 {
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    (hash % u64::from(shards.max(1))) as u8
}

/// Shard `shard` of partition `pk`.
pub fn sharded(pk: &str, shard: u8) -> String {
    format!("{pk}#{shard:x}")
}

// Base-table partitions.

pub fn tenant(id: &TenantId) -> String {
    format!("TENANT#{id}")
}

pub fn api_key(hash: &str) -> String {
    format!("KEY#{hash}")
}

/// The item that records that an admin key exists (key items are found by hash only).
pub const ADMIN_MARKER: &str = "ADMIN_KEY_EXISTS";

pub fn endpoint(id: &EndpointId) -> String {
    format!("EP#{id}")
}

/// How many endpoints a tenant has: a create checks the limit and adds itself to it
/// in the transaction that stores the endpoint, so racing creates cannot both pass.
pub fn tenant_endpoint_count(tenant: &TenantId) -> String {
    format!("EP_COUNT#{tenant}")
}

/// Where the local emulation of the outbox stream's event source mapping resumes in
/// `shard` ([`crate::stream_checkpoints`]; on AWS, Lambda keeps its own).
pub fn stream_checkpoint(shard: &str) -> String {
    format!("STREAM_CHECKPOINT#{shard}")
}

/// A delivery item's key: its day's log partition (a shard chosen by its id), sorted
/// by id, so the admin's log of every tenant is the table read newest first and
/// costs no index entry. Both parts come from the id (it carries its time).
pub fn delivery(id: &DeliveryId) -> (String, String) {
    let day_pk = day(id.timestamp_ms());
    (
        sharded(&day_pk, shard(id.as_str(), DAY_SHARDS)),
        id.to_string(),
    )
}

/// The partition of a delivery's attempts (sort keys [`attempt`]).
pub fn delivery_attempts(id: &DeliveryId) -> String {
    format!("DLV#{id}")
}

/// An attempt's sort key in its delivery's partition: in generation and number order.
pub fn attempt(a: &Attempt) -> String {
    format!(
        "{ATTEMPT_PREFIX}{:05}#{:05}#{}",
        a.generation, a.number, a.id
    )
}

/// The sort-key prefix of every attempt.
pub const ATTEMPT_PREFIX: &str = "ATT#";

pub fn failure(id: &FailureId) -> String {
    format!("FAIL#{id}")
}

pub fn counter(name: &str) -> String {
    format!("CNT#{name}")
}

pub fn remembered(key: &str) -> String {
    format!("REMEMBER#{key}")
}

/// One shard of a tenant's backlog counter.
pub fn backlog(tenant: &TenantId, shard: u8) -> String {
    sharded(&format!("BACKLOG#{tenant}"), shard)
}

/// Slot `slot` of a pool: an endpoint's concurrency cap, or the share of the slow
/// endpoints. Each slot is its own partition: at 1 000 attempts a second to one
/// endpoint, every slot is written twice per attempt it holds, and one partition for
/// all of them would take 2 000 writes a second.
pub fn slot(pool: &SlotPool, slot: u32) -> String {
    match pool {
        SlotPool::Endpoint(endpoint) => format!("SLOT#{endpoint}#{slot}"),
        SlotPool::SlowEndpoints => format!("SLOT#SLOW_ENDPOINTS#{slot}"),
    }
}

// Index partitions.

/// [`BY_DUE`]: an endpoint's paused deliveries (sparse: a delivery is in it only
/// while paused, and never in the due partitions then), for the background resume.
pub fn endpoint_paused(endpoint: &EndpointId) -> String {
    format!("PAUSED#{endpoint}")
}

/// [`BY_DUE`]: the partition of a waiting delivery.
pub fn due(delivery: &DeliveryId) -> String {
    due_shard(shard(delivery.as_str(), DUE_SHARDS))
}

/// [`BY_DUE`]: one of its [`DUE_SHARDS`] partitions.
pub fn due_shard(shard: u8) -> String {
    sharded("DUE", shard)
}

/// [`BY_DUE`]: the sort key of a delivery due at `at_ms`, its due slot's start
/// (`2026-11-30T13:40`). Index keys need not be unique, so the slot alone does: every
/// byte counts, the delivery item stays under the 1 KiB of one write unit.
/// The sort keys of deliveries due in slots that ended by `at_ms` are all below
/// `due_slot(at_ms)`.
pub fn due_slot(at_ms: i64) -> String {
    let slot_ms = DUE_SLOT_MINUTES * 60_000;
    let start = at_ms.div_euclid(slot_ms) * slot_ms;
    let at = Utc.timestamp_millis_opt(start).single().unwrap_or_default();
    at.format("%Y-%m-%dT%H:%M").to_string()
}

/// [`BY_TENANT`]: a tenant's deliveries.
pub fn tenant_deliveries(tenant: &TenantId) -> String {
    format!("T#{tenant}")
}

/// [`BY_TENANT`]: a tenant's endpoints.
pub fn tenant_endpoints(tenant: &TenantId) -> String {
    format!("TENANT_EP#{tenant}")
}

/// [`BY_TENANT`]: a tenant's failures.
pub fn tenant_failures(tenant: &TenantId) -> String {
    format!("TF#{tenant}")
}

/// [`BY_ENDPOINT`]: every unacknowledged failure, oldest first (the entry is removed
/// on acknowledgement: a sparse index the 24-hour rule reads only as far as it must).
pub const UNACKNOWLEDGED: &str = "UNACK";

/// [`BY_ENDPOINT`]: an endpoint's deliveries.
pub fn endpoint_deliveries(endpoint: &EndpointId) -> String {
    format!("E#{endpoint}")
}

/// [`BY_ENDPOINT`]: an endpoint's attempts, sorted by [`attempt_time`].
pub fn endpoint_attempts(endpoint: &EndpointId) -> String {
    format!("EA#{endpoint}")
}

pub fn attempt_time(a: &Attempt) -> String {
    format!("{}#{}", format_timestamp(a.started_at), a.id)
}

/// [`BY_KIND`]: every tenant, every endpoint, every failure.
pub const ALL_TENANTS: &str = "ALL_TEN";
pub const ALL_ENDPOINTS: &str = "ALL_EP";
pub const ALL_FAILURES: &str = "ALL_FAIL";

/// The prefix and date form of a day partition.
const DAY_PREFIX: &str = "D#";
const DAY_FORMAT: &str = "%Y-%m-%d";

/// The deliveries created on the day of `id_ms` (the admin's log), in the table.
pub fn day(id_ms: i64) -> String {
    let date = Utc.timestamp_millis_opt(id_ms).single().unwrap_or_default();
    format!("{DAY_PREFIX}{}", date.format(DAY_FORMAT))
}

/// A cursor below every delivery id of the day partition `day_pk` (from [`day`]):
/// the day's first millisecond with the lowest possible random part.
pub fn day_floor(day_pk: &str) -> String {
    let start = day_pk
        .strip_prefix(DAY_PREFIX)
        .and_then(|d| chrono::NaiveDate::parse_from_str(d, DAY_FORMAT).ok())
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map_or(0, |t| t.and_utc().timestamp_millis());
    format!("{}{}", delivery_ids_of_ms(start), "0".repeat(20))
}

/// The start every delivery id made in millisecond `ms` shares (the id's time part).
pub fn delivery_ids_of_ms(ms: i64) -> String {
    format!("{}{:012x}", DeliveryId::PREFIX, ms.max(0))
}

/// The millisecond a delivery id, or a key made by [`delivery_ids_of_ms`], starts with.
pub fn ms_of_delivery_key(key: &str) -> Option<i64> {
    let hex = key.strip_prefix(DeliveryId::PREFIX)?.get(..12)?;
    i64::from_str_radix(hex, 16).ok()
}

/// The item holding how far the sweeper's scan of the day partitions has read
/// ([`super::due_scan`]).
pub const DUE_SCAN_CURSOR: &str = "DUE_SCAN_CURSOR";

/// [`BY_PARENT`]: one delivery's failure records.
pub fn delivery_failures(delivery: &DeliveryId) -> String {
    format!("FD#{delivery}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_spread_over_every_shard_and_stay_in_theirs() {
        let mut counts = [0u32; DAY_SHARDS as usize];
        for _ in 0..64_000 {
            let id = DeliveryId::generate();
            let s = shard(id.as_str(), DAY_SHARDS);
            assert_eq!(s, shard(id.as_str(), DAY_SHARDS), "stable");
            counts[s as usize] += 1;
        }
        // 1 000 expected per shard; a fair hash stays well within ±20 %.
        assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
        assert_eq!(sharded("T#ten_1", 11), "T#ten_1#b");
        let id = DeliveryId::generate();
        let floor = day_floor(&day(id.timestamp_ms()));
        assert!(
            floor.as_str() < id.as_str(),
            "the floor is below the day's ids"
        );
        assert!(floor.parse::<DeliveryId>().is_ok(), "and a valid cursor");
        assert!(
            id.as_str()
                .starts_with(&delivery_ids_of_ms(id.timestamp_ms())),
            "an id starts with its millisecond's prefix"
        );
    }
}
