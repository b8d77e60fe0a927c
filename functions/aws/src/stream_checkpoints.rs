//! Where the local emulation of the outbox stream's event source mapping keeps its
//! place in each shard: in the main table, as Lambda keeps its own on AWS. Kept only in
//! memory, every start of `serve --backend aws` read each shard from its start again,
//! and fanned every event out anew to the endpoints of the day (a hostile test: a
//! restart sent old events to an endpoint created since, and took a minute per
//! thousand events in the stream).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::dynamo::{keys, s, ONLY, PK, SK};

/// The attribute holding the sequence number to resume after.
const SEQUENCE_NUMBER: &str = "sequence_number";

/// Each shard's place, read through from the table once, written at every batch.
pub struct StreamCheckpoints {
    client: aws_sdk_dynamodb::Client,
    table: String,
    known: HashMap<String, Option<String>>,
}

impl StreamCheckpoints {
    pub fn new(client: aws_sdk_dynamodb::Client, table: String) -> Self {
        Self {
            client,
            table,
            known: HashMap::new(),
        }
    }

    fn key(shard: &str) -> HashMap<String, AttributeValue> {
        HashMap::from([
            (PK.to_owned(), s(keys::stream_checkpoint(shard))),
            (SK.to_owned(), s(ONLY)),
        ])
    }

    /// The sequence number to resume after in `shard` (`None`: read it from its start).
    pub async fn get(&mut self, shard: &str) -> Result<Option<String>, String> {
        if let Some(known) = self.known.get(shard) {
            return Ok(known.clone());
        }
        let item = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(shard)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| entrega_core::text::with_causes(&e))?;
        let sequence = item
            .item()
            .and_then(|i| i.get(SEQUENCE_NUMBER))
            .and_then(|v| v.as_s().ok())
            .cloned();
        self.known.insert(shard.to_owned(), sequence.clone());
        Ok(sequence)
    }

    /// `shard` is handled up to `sequence`. Written after the batch's fan-out, so a
    /// crash between the two hands the batch over again (the fan-out is idempotent),
    /// never skips it.
    pub async fn set(&mut self, shard: &str, sequence: &str) -> Result<(), String> {
        let mut item = Self::key(shard);
        item.insert(SEQUENCE_NUMBER.to_owned(), s(sequence));
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| entrega_core::text::with_causes(&e))?;
        self.known
            .insert(shard.to_owned(), Some(sequence.to_owned()));
        Ok(())
    }
}
