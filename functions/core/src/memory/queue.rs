//! A message queue in memory with the semantics the handlers rely on: a received
//! message is hidden for its visibility timeout and comes back unless deleted, every
//! receive counts, a receipt is good only until the message is received again, and
//! receiving is round-robin over groups (tenants) with each concurrency key (endpoint)
//! capped at its limit in flight — as the embedded queue does.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::ports::{
    Clock, DelayLimits, LongDelayScheduler, MessageQueue, OutgoingMessage, ReceivedMessage,
    StoreResult,
};

#[derive(Debug)]
struct Message {
    body: String,
    group: String,
    key: Option<String>,
    limit: u32,
    visible_at: DateTime<Utc>,
    receive_count: u32,
    /// Which receipt is current (bumped on every receive).
    receipt: u64,
    /// Received and not yet deleted or made visible.
    in_flight: bool,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    messages: BTreeMap<u64, Message>,
    /// Groups in receive order; the front one is served first.
    turn: VecDeque<String>,
}

/// The in-memory queue; cheap to clone (shared).
#[derive(Clone)]
pub struct MemoryQueue {
    clock: Arc<dyn Clock>,
    state: Arc<Mutex<State>>,
}

impl MemoryQueue {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            state: Arc::default(),
        }
    }

    /// Messages in the queue, visible or not.
    pub fn len(&self) -> usize {
        self.lock().messages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// When the next message becomes receivable (`None`: the queue is empty). A
    /// simulation moves its clock there when nothing is receivable now.
    pub fn next_visible_at(&self) -> Option<DateTime<Utc>> {
        self.lock().messages.values().map(|m| m.visible_at).min()
    }

    /// Every message's body, visible or not, oldest first (for invariant checks).
    pub fn bodies(&self) -> Vec<String> {
        self.lock()
            .messages
            .values()
            .map(|m| m.body.clone())
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn receipt_of(id: u64, number: u64) -> String {
    format!("{id}:{number}")
}

fn parse_receipt(receipt: &str) -> Option<(u64, u64)> {
    let (id, number) = receipt.split_once(':')?;
    Some((id.parse().ok()?, number.parse().ok()?))
}

fn delay(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

impl State {
    /// A visible message of `group` whose key has room, oldest first.
    fn next_of(&self, group: &str, now: DateTime<Utc>) -> Option<u64> {
        self.messages
            .iter()
            .filter(|(_, m)| m.group == group && m.visible_at <= now)
            .find(|(_, m)| match &m.key {
                None => true,
                Some(key) => {
                    let busy = self
                        .messages
                        .values()
                        .filter(|o| {
                            o.in_flight && o.visible_at > now && o.key.as_ref() == Some(key)
                        })
                        .count();
                    busy < m.limit.max(1) as usize
                }
            })
            .map(|(id, _)| *id)
    }
}

#[async_trait]
impl MessageQueue for MemoryQueue {
    async fn send(&self, messages: Vec<OutgoingMessage>) -> StoreResult<()> {
        let now = self.clock.now();
        let mut state = self.lock();
        for m in messages {
            state.next_id += 1;
            let id = state.next_id;
            if !state.turn.contains(&m.group) {
                state.turn.push_back(m.group.clone());
            }
            state.messages.insert(
                id,
                Message {
                    body: m.body,
                    group: m.group,
                    key: m.concurrency_key,
                    limit: m.concurrency_limit,
                    visible_at: now + delay(m.delay),
                    receive_count: 0,
                    receipt: 0,
                    in_flight: false,
                },
            );
        }
        Ok(())
    }

    async fn receive(&self, max: usize, visibility: Duration) -> StoreResult<Vec<ReceivedMessage>> {
        let now = self.clock.now();
        let mut state = self.lock();
        let mut out = Vec::new();
        // One message per group per round, groups in turn: a tenant's backlog does
        // not stand in front of another tenant's message.
        let mut idle_groups = 0;
        while out.len() < max && idle_groups < state.turn.len() {
            let Some(group) = state.turn.pop_front() else {
                break;
            };
            let picked = state.next_of(&group, now);
            state.turn.push_back(group);
            let Some(id) = picked else {
                idle_groups += 1;
                continue;
            };
            idle_groups = 0;
            let message = state.messages.get_mut(&id).expect("picked from the map");
            message.receive_count += 1;
            message.receipt += 1;
            message.in_flight = true;
            message.visible_at = now + delay(visibility);
            out.push(ReceivedMessage {
                receipt: receipt_of(id, message.receipt),
                body: message.body.clone(),
                receive_count: message.receive_count,
            });
        }
        Ok(out)
    }

    async fn change_visibility(&self, receipt: &str, hide: Duration) -> StoreResult<()> {
        let now = self.clock.now();
        let mut state = self.lock();
        if let Some((id, number)) = parse_receipt(receipt) {
            if let Some(m) = state.messages.get_mut(&id).filter(|m| m.receipt == number) {
                m.visible_at = now + delay(hide);
                m.in_flight = false;
            }
        }
        Ok(())
    }

    async fn delete(&self, receipt: &str) -> StoreResult<()> {
        let mut state = self.lock();
        if let Some((id, number)) = parse_receipt(receipt) {
            if state.messages.get(&id).is_some_and(|m| m.receipt == number) {
                state.messages.remove(&id);
            }
        }
        Ok(())
    }

    fn delay_limits(&self) -> DelayLimits {
        DelayLimits::UNLIMITED
    }
}

/// Long delays are just later visibility here, as in the embedded queue.
#[async_trait]
impl LongDelayScheduler for MemoryQueue {
    async fn schedule(&self, mut message: OutgoingMessage, at: DateTime<Utc>) -> StoreResult<()> {
        message.delay = (at - self.clock.now()).to_std().unwrap_or(Duration::ZERO);
        self.send(vec![message]).await
    }
}
