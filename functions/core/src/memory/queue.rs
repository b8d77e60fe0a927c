//! A message queue in memory with the semantics the handlers rely on: a received
//! message is hidden for its visibility timeout and comes back unless deleted, every
//! receive counts, a receipt is good only until the message is received again, and
//! receiving is round-robin over groups (tenants) with each concurrency key (endpoint)
//! capped at its limit in flight — as the embedded queue does.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
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
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    messages: BTreeMap<u64, Message>,
    /// Every message by when it becomes receivable: a receive reads only the due.
    by_visibility: BTreeSet<(DateTime<Utc>, u64)>,
    /// Messages received and not since settled or made visible.
    in_flight: BTreeSet<u64>,
    /// Groups in receive order; the front one is served first.
    turn: VecDeque<String>,
}

impl State {
    fn set_visible_at(&mut self, id: u64, at: DateTime<Utc>) {
        if let Some(m) = self.messages.get_mut(&id) {
            self.by_visibility.remove(&(m.visible_at, id));
            m.visible_at = at;
            self.by_visibility.insert((at, id));
        }
    }

    fn remove(&mut self, id: u64) {
        if let Some(m) = self.messages.remove(&id) {
            self.by_visibility.remove(&(m.visible_at, id));
            self.in_flight.remove(&id);
        }
    }
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
        self.lock().by_visibility.first().map(|(at, _)| *at)
    }

    /// When the next message becomes receivable after `t` (messages visible at `t`
    /// that no receive took are waiting for their key's room, which only a settled
    /// message makes).
    pub fn next_visible_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.lock()
            .by_visibility
            .range((t, u64::MAX)..)
            .next()
            .map(|(at, _)| *at)
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
            let visible_at = now + delay(m.delay);
            state.by_visibility.insert((visible_at, id));
            state.messages.insert(
                id,
                Message {
                    body: m.body,
                    group: m.group,
                    key: m.concurrency_key,
                    limit: m.concurrency_limit,
                    visible_at,
                    receive_count: 0,
                    receipt: 0,
                },
            );
        }
        Ok(())
    }

    async fn receive(&self, max: usize, visibility: Duration) -> StoreResult<Vec<ReceivedMessage>> {
        let now = self.clock.now();
        let mut guard = self.lock();
        let state = &mut *guard;
        // Attempts in flight per key: received and still hidden.
        let mut busy: HashMap<String, usize> = HashMap::new();
        for id in &state.in_flight {
            let m = &state.messages[id];
            if let (Some(key), true) = (&m.key, m.visible_at > now) {
                *busy.entry(key.clone()).or_default() += 1;
            }
        }
        // The due messages of each group, oldest first.
        let mut due: HashMap<String, VecDeque<u64>> = HashMap::new();
        let mut ids: Vec<u64> = state
            .by_visibility
            .range(..=(now, u64::MAX))
            .map(|(_, id)| *id)
            .collect();
        ids.sort_unstable();
        for id in ids {
            due.entry(state.messages[&id].group.clone())
                .or_default()
                .push_back(id);
        }
        let mut out = Vec::new();
        // One message per group per round, groups in turn: a tenant's backlog does
        // not stand in front of another tenant's message.
        let mut idle_groups = 0;
        while out.len() < max && idle_groups < state.turn.len() {
            let Some(group) = state.turn.pop_front() else {
                break;
            };
            let candidates = due.entry(group.clone()).or_default();
            let room = |id: &u64| {
                let m = &state.messages[id];
                m.key
                    .as_ref()
                    .is_none_or(|k| busy.get(k).copied().unwrap_or(0) < m.limit.max(1) as usize)
            };
            let picked = candidates
                .iter()
                .position(room)
                .and_then(|at| candidates.remove(at));
            state.turn.push_back(group);
            let Some(id) = picked else {
                idle_groups += 1;
                continue;
            };
            idle_groups = 0;
            let hidden_until = now + delay(visibility);
            state.set_visible_at(id, hidden_until);
            state.in_flight.insert(id);
            let message = state.messages.get_mut(&id).expect("picked from the map");
            message.receive_count += 1;
            message.receipt += 1;
            if let Some(key) = &message.key {
                *busy.entry(key.clone()).or_default() += 1;
            }
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
            if state.messages.get(&id).is_some_and(|m| m.receipt == number) {
                state.set_visible_at(id, now + delay(hide));
                state.in_flight.remove(&id);
            }
        }
        Ok(())
    }

    async fn delete(&self, receipt: &str) -> StoreResult<()> {
        let mut state = self.lock();
        if let Some((id, number)) = parse_receipt(receipt) {
            if state.messages.get(&id).is_some_and(|m| m.receipt == number) {
                state.remove(id);
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
