//! How the drain names an outbox row: by its tenant and id together, as the
//! producer's key is (an id is scoped to its tenant).

use entrega_core::producer_outbox::OutboxRow;

/// A row of the outbox: its tenant and id (an id is scoped to its tenant).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct RowKey {
    pub(super) tenant_id: String,
    pub(super) id: String,
}

impl RowKey {
    pub(super) fn of(row: &OutboxRow) -> Self {
        Self {
            tenant_id: row.tenant_id.clone(),
            id: row.id.clone(),
        }
    }
}

/// The keys' two columns, as arrays for `unnest($1::text[], $2::text[])`.
pub(super) fn key_columns<'a>(
    keys: impl Iterator<Item = &'a RowKey>,
) -> (Vec<&'a str>, Vec<&'a str>) {
    keys.map(|k| (k.tenant_id.as_str(), k.id.as_str())).unzip()
}
