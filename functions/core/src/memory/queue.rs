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

/// Where a message waits: its group (tenant) and its concurrency key (endpoint).
type LaneId = (String, Option<String>);

/// One entry per message, ordered by when it becomes receivable.
type Schedule = BTreeSet<(DateTime<Utc>, u64)>;

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    messages: BTreeMap<u64, Message>,
    /// Every message by when it becomes receivable (for the clock of a simulation).
    by_visibility: Schedule,
    /// Every message of a lane by when it becomes receivable. A receive looks only at
    /// the head of each lane, so a backlog of 50 000 behind one capped endpoint costs
    /// one comparison per receive, not a scan.
    lanes: HashMap<LaneId, Schedule>,
    /// The lanes of each group, in the order they first appeared.
    lanes_of_group: HashMap<String, Vec<Option<String>>>,
    /// Per concurrency key, its received messages still hidden (by hidden-until): how
    /// many attempts that key has in flight.
    in_flight: HashMap<String, Schedule>,
    /// Groups in receive order; the front one is served first.
    turn: VecDeque<String>,
}

impl State {
    fn set_visible_at(&mut self, id: u64, at: DateTime<Utc>, in_flight: bool) {
        let Some(m) = self.messages.get_mut(&id) else {
            return;
        };
        let old = (m.visible_at, id);
        self.by_visibility.remove(&old);
        self.by_visibility.insert((at, id));
        if let Some(lane) = self.lanes.get_mut(&(m.group.clone(), m.key.clone())) {
            lane.remove(&old);
            lane.insert((at, id));
        }
        if let Some(key) = &m.key {
            let flying = self.in_flight.entry(key.clone()).or_default();
            flying.remove(&old);
            if in_flight {
                flying.insert((at, id));
            }
        }
        m.visible_at = at;
    }

    fn remove(&mut self, id: u64) {
        let Some(m) = self.messages.remove(&id) else {
            return;
        };
        let entry = (m.visible_at, id);
        self.by_visibility.remove(&entry);
        if let Some(lane) = self.lanes.get_mut(&(m.group, m.key.clone())) {
            lane.remove(&entry);
        }
        if let Some(flying) = m.key.and_then(|k| self.in_flight.get_mut(&k)) {
            flying.remove(&entry);
        }
    }

    /// Attempts in flight under `key` at `now`: a message whose visibility ran out is
    /// receivable again, so it no longer holds a place.
    fn busy(&mut self, key: &str, now: DateTime<Utc>) -> usize {
        let Some(flying) = self.in_flight.get_mut(key) else {
            return 0;
        };
        while flying.first().is_some_and(|(at, _)| *at <= now) {
            flying.pop_first();
        }
        flying.len()
    }

    /// The message this group should hand out now: among its lanes whose key has room,
    /// the head that became receivable first.
    fn pick(&mut self, group: &str, now: DateTime<Utc>) -> Option<u64> {
        let keys = self.lanes_of_group.get(group)?.clone();
        let mut best: Option<(DateTime<Utc>, u64)> = None;
        for key in keys {
            let lane_id = (group.to_string(), key);
            let Some(&(at, id)) = self.lanes.get(&lane_id).and_then(|l| l.first()) else {
                continue;
            };
            if at > now || best.is_some_and(|b| b <= (at, id)) {
                continue;
            }
            let limit = self.messages[&id].limit.max(1) as usize;
            if let Some(key) = &lane_id.1 {
                if self.busy(key, now) >= limit {
                    continue;
                }
            }
            best = Some((at, id));
        }
        best.map(|(_, id)| id)
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
            let visible_at = now + delay(m.delay);
            let lanes = state.lanes_of_group.entry(m.group.clone()).or_default();
            let new_group = lanes.is_empty();
            if !lanes.contains(&m.concurrency_key) {
                lanes.push(m.concurrency_key.clone());
            }
            if new_group {
                state.turn.push_back(m.group.clone());
            }
            state.by_visibility.insert((visible_at, id));
            state
                .lanes
                .entry((m.group.clone(), m.concurrency_key.clone()))
                .or_default()
                .insert((visible_at, id));
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
        let hidden_until = now + delay(visibility);
        let mut state = self.lock();
        let mut out = Vec::new();
        // One message per group per round, groups in turn: a tenant's backlog does
        // not stand in front of another tenant's message.
        let mut idle_groups = 0;
        while out.len() < max && idle_groups < state.turn.len() {
            let Some(group) = state.turn.pop_front() else {
                break;
            };
            let picked = state.pick(&group, now);
            state.turn.push_back(group);
            let Some(id) = picked else {
                idle_groups += 1;
                continue;
            };
            idle_groups = 0;
            state.set_visible_at(id, hidden_until, true);
            let message = state.messages.get_mut(&id).expect("picked from the map");
            message.receive_count += 1;
            message.receipt += 1;
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
                state.set_visible_at(id, now + delay(hide), false);
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
