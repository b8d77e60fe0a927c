//! The embedded notifier: alerts and owner notices go to the log (at `warn`), where an
//! operator's log shipping picks them up.

use async_trait::async_trait;
use entrega_core::ports::{Notice, Notifier, StoreResult};

pub struct LogNotifier;

#[async_trait]
impl Notifier for LogNotifier {
    async fn notify(&self, notice: &Notice) -> StoreResult<()> {
        tracing::warn!(
            kind = %notice.kind,
            tenant_id = %notice.tenant_id,
            details = %notice.details,
            "{}",
            notice.summary
        );
        Ok(())
    }
}
