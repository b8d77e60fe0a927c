//! The 24-hour rule: a failure nobody has acknowledged for a day is surfaced again —
//! as a metric (the age of the oldest one) and as an alert — by a scheduled check, so
//! it is raised even when no new failure arrives.

use std::time::Duration;

use chrono::DurationRound;

use crate::event::format_timestamp;
use crate::ports::{Audience, Notice, NoticeKind, Services, StoreResult, MAX_PAGE_SIZE};
use crate::remembered::RememberedKey;

use super::notices::notify_once;

/// How long a failure may stay unacknowledged.
pub const MAX_UNACKNOWLEDGED_AGE: Duration = Duration::from_secs(24 * 3600);
/// Pages of unacknowledged failures read per check: bounded work; failures are the
/// rare case, and a backlog beyond this is an alarm on its own.
const MAX_PAGES: usize = 10;
/// One age alert per failure per day.
const ALERT_CLAIM_TTL: Duration = Duration::from_secs(26 * 3600);

/// Run the check; returns the age of the oldest unacknowledged failure.
pub async fn check_unacknowledged(services: &Services) -> StoreResult<Option<Duration>> {
    let now = services.clock.now();
    let limit = services.settings.max_unacknowledged_age;
    let mut cursor: Option<String> = None;
    let mut oldest = None;
    // Oldest first: the check stops at the first failure still within its day, so it
    // reads the overdue ones and one more, however many failures are open.
    'pages: for _ in 0..MAX_PAGES {
        let page = services
            .store
            .oldest_unacknowledged(MAX_PAGE_SIZE, cursor.as_deref())
            .await?;
        for failure in &page.data {
            let age = (now - failure.created_at).to_std().unwrap_or_default();
            oldest = Some(oldest.map_or(age, |o: Duration| o.max(age)));
            if age <= limit {
                break 'pages;
            }
            let day = now
                .duration_trunc(chrono::TimeDelta::days(1))
                .unwrap_or(now);
            let notice = Notice {
                kind: NoticeKind::FailureUnacknowledged,
                audience: Audience::OnCall,
                tenant_id: failure.tenant_id.clone(),
                summary: format!(
                    "failure {} unacknowledged for {} h",
                    failure.id,
                    age.as_secs() / 3600
                ),
                details: serde_json::json!({
                    "failure_id": failure.id,
                    "delivery_id": failure.delivery_id,
                    "event_id": failure.event_id,
                    "failed_at": format_timestamp(failure.created_at),
                    "age_seconds": age.as_secs(),
                }),
            };
            let claim = RememberedKey::AgeAlert {
                failure: &failure.id,
                day,
            };
            notify_once(services, claim, None, ALERT_CLAIM_TTL, notice).await?;
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    services.metrics.oldest_unacknowledged_failure(oldest);
    Ok(oldest)
}
