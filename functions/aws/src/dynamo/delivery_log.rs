//! The delivery log's pages (`GET /v1/deliveries`): by endpoint or tenant from their
//! sharded indexes, the admin's all-tenant log by walking the day partitions.

use chrono::{DateTime, Duration as ChronoDuration, TimeZone, Utc};
use entrega_core::delivery::Delivery;
use entrega_core::ids::DeliveryId;
use entrega_core::ports::{DeliveryQuery, Page, StoreResult};

use super::*;

/// Days of the admin's all-tenant log one list request reads at most (each within
/// the page budget of one listing); the rest is a cursor.
const DAYS_PER_LIST: usize = 4;

/// Whether a delivery passes the query's non-key filters.
fn matches(d: &Delivery, q: &DeliveryQuery) -> bool {
    q.tenant.as_ref().is_none_or(|t| *t == d.tenant_id)
        && q.endpoint_id.as_ref().is_none_or(|e| *e == d.endpoint_id)
        && q.event_type.as_ref().is_none_or(|t| *t == d.event_type)
        && q.status.is_none_or(|s| s == d.state.status())
        && q.since.is_none_or(|s| d.created_at >= s)
        && q.until.is_none_or(|u| d.created_at < u)
}

impl DynamoStore {
    /// One page of the delivery log: an endpoint's or a tenant's from its sharded
    /// index, the admin's all-tenant log from the day partitions, newest first.
    pub(super) async fn delivery_log_page(&self, q: &DeliveryQuery) -> StoreResult<Page<Delivery>> {
        let partitions: Vec<Partition> = if let Some(ep) = &q.endpoint_id {
            vec![Partition::sharded(
                keys::BY_ENDPOINT,
                keys::endpoint_deliveries(ep),
                keys::OWNER_SHARDS,
            )]
        } else if let Some(t) = &q.tenant {
            vec![Partition::sharded(
                keys::BY_TENANT,
                keys::tenant_deliveries(t),
                keys::OWNER_SHARDS,
            )]
        } else {
            // The admin's all-tenant log: walk day partitions newest first, from the
            // cursor's day (or `until`, or today) back to `since` (or the retention).
            let now = self.clock.now();
            let cursor_time = q
                .cursor
                .as_deref()
                .and_then(|c| c.parse::<DeliveryId>().ok())
                .and_then(|id| Utc.timestamp_millis_opt(id.timestamp_ms()).single());
            let newest: DateTime<Utc> = cursor_time.or(q.until).unwrap_or(now).min(now);
            let oldest = q
                .since
                .unwrap_or(now - ChronoDuration::days(self.retention_days));
            let mut days = Vec::new();
            let mut day = newest;
            while day.date_naive() >= oldest.date_naive()
                && days.len() as i64 <= self.retention_days + 1
            {
                days.push(Partition::table(
                    keys::day(day.timestamp_millis()),
                    keys::DAY_SHARDS,
                ));
                day -= ChronoDuration::days(1);
            }
            days
        };
        let mut items = Vec::new();
        let mut resume = None;
        for (i, part) in partitions.iter().enumerate() {
            if i >= DAYS_PER_LIST {
                // Out of budget between days: go on below the last day read whole (a
                // cursor just under its first possible id).
                resume = Some(keys::day_floor(&partitions[i - 1].pk));
                break;
            }
            // Each day its own page budget: a quiet day costs one query per shard.
            let mut pages = 0;
            let found = self
                .collect_desc(
                    part,
                    q.cursor.as_deref(),
                    q.limit + 1 - items.len(),
                    &|item| from_json::<Delivery>(item).is_ok_and(|d| matches(&d, q)),
                    &mut pages,
                )
                .await?;
            items.extend(found.items.into_iter().map(|(_, item)| item));
            if items.len() > q.limit {
                break;
            }
            if found.more {
                // Out of page budget: resume after the last item read.
                resume = found.last_seen;
                break;
            }
        }
        let data = items
            .iter()
            .map(from_json)
            .collect::<Result<Vec<Delivery>, _>>()?;
        Ok(Page::from_rows(data, q.limit, |d| d.id.to_string(), resume))
    }
}
