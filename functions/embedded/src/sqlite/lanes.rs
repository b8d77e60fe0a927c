//! The embedded queue's scheduler, in memory: which message a receive hands out next.
//!
//! Messages live in *lanes* — one per concurrency key (an endpoint) within a group (a
//! tenant) — and receiving is round-robin twice over: across groups with runnable
//! lanes, then across the runnable lanes of the group. A lane is runnable when its
//! oldest message is visible and it has fewer in flight than its limit. Lanes that are
//! not runnable are parked (on a timer for a delayed head, or until an in-flight
//! message ends), so one endpoint's backlog of any size is never looked at while it is
//! saturated: a receive costs time proportional to what it hands out, not to the
//! queue. That is what keeps a tenant's fast endpoint fast beside its slow one.
//!
//! The worker's slots are shared, and without more than caps, tenants whose endpoints
//! hang (or one endpoint with a cap as large as the worker) would hold every slot
//! until their attempts time out. So ([`Scheduler::keep_last_slots`]):
//! - an attempt that runs long is *noted slow*: its group counts as slow for a while,
//!   and the message may be *demoted*, counted against its lane's cap only, as its
//!   attempt moves out of the worker's slots into slow ones (a bounded number per
//!   group);
//! - once `shared` messages are in flight in all, only a *light* group gets another:
//!   one with fewer than `floor` in flight and not slow lately.
//!
//! So hanging tenants, however many, leave the last slots to the others. And a lane
//! whose attempt ran long lately has its next attempts demoted as they start
//! ([`Scheduler::demote_if_lane_slow`]): they never spend their first moments in the
//! worker's slots, so a slow endpoint that turns over quickly cannot fill its tenant's
//! share, and the tenant's quick endpoints keep their pace.
//!
//! The scheduler holds no bodies and does no I/O; the SQLite queue persists every
//! message and rebuilds this at start-up (only one process may open the database, so
//! memory and file cannot disagree across processes).

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, VecDeque};

/// A message's row id.
pub type MessageId = i64;
/// Milliseconds since the epoch, from the clock port.
pub type Millis = i64;

type LaneId = u64;
type GroupId = u64;

struct Message {
    lane: LaneId,
    /// When it becomes visible (again).
    visible_at: Millis,
    in_flight: bool,
    /// In flight but no longer counted against its group's share or the shared
    /// slots ([`Scheduler::note_slow`]); still against its lane's cap.
    demoted: bool,
    /// Counted in the scheduler's `slow_in_flight`: its group was slow when it was
    /// handed out, or it was noted slow without being demoted.
    slow_share: bool,
    /// The latest receipt handed out; only it may delete or re-hide the message.
    receipt: u64,
    receive_count: u32,
}

struct Lane {
    group: GroupId,
    key: (String, Option<String>),
    limit: u32,
    /// Messages not in flight, by visibility time.
    ready: BTreeSet<(Millis, MessageId)>,
    in_flight: u32,
    /// Messages of the lane in any state.
    len: u64,
    in_rotation: bool,
    /// The pending timer for a delayed head, if one is set.
    timer_at: Option<Millis>,
    /// Until when one of its attempts counts as having run long lately.
    slow_until: Millis,
}

struct Group {
    name: String,
    /// Runnable lanes, served in turn.
    rotation: VecDeque<LaneId>,
    in_rotation: bool,
    len: u64,
    /// Messages of the group's lanes in flight.
    in_flight: u32,
    /// Whether it is in the scheduler's `held_back` (at most once).
    held_back: bool,
    /// Its demoted messages (see [`Scheduler::note_slow`]).
    demoted: u32,
    /// Until when it counts as slow: one of its attempts ran long lately.
    slow_until: Millis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// A lane's head becomes visible.
    Lane(LaneId),
    /// A received message's visibility timeout runs out (if the receipt is current).
    Expiry(MessageId, u64),
}

/// A message handed out by [`Scheduler::receive`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handout {
    pub id: MessageId,
    pub receipt: u64,
    pub receive_count: u32,
}

/// See the module docs.
pub struct Scheduler {
    messages: HashMap<MessageId, Message>,
    lanes: HashMap<LaneId, Lane>,
    lane_index: HashMap<(String, Option<String>), LaneId>,
    groups: HashMap<GroupId, Group>,
    group_index: HashMap<String, GroupId>,
    /// Groups with at least one runnable lane, served in turn.
    rotation: VecDeque<GroupId>,
    timers: BinaryHeap<Reverse<(Millis, Timer)>>,
    next_id: u64,
    next_receipt: u64,
    /// Messages in flight, in all (but demoted ones).
    in_flight: u32,
    /// Of those, the ones counted against slow groups' share (`KeptSlots::slow_share`).
    slow_in_flight: u32,
    /// See [`Scheduler::keep_last_slots`].
    slots: KeptSlots,
    /// Groups passed over because the shared slots were taken: back in rotation when
    /// one frees.
    held_back: Vec<GroupId>,
}

/// See [`Scheduler::keep_last_slots`].
#[derive(Debug, Clone, Copy)]
pub struct KeptSlots {
    /// In flight in all past which only light groups get another message: groups
    /// with fewer than `floor` in flight that have not been slow for `slow_memory`.
    pub shared: u32,
    pub floor: u32,
    pub slow_memory: Millis,
    /// Most demoted messages one group may have.
    pub demoted_per_group: u32,
    /// Most messages of groups slow lately in flight at once (but demoted ones): they
    /// share this many of the shared slots, so attempts that neither end nor move out
    /// (the slow slots all taken) cannot crowd out quick ones.
    pub slow_share: u32,
}

impl Scheduler {
    /// `receipt_seed` makes receipts unpredictable across restarts, so a receipt from a
    /// previous process never matches a message of this one.
    pub fn new(receipt_seed: u64) -> Self {
        Self {
            messages: HashMap::new(),
            lanes: HashMap::new(),
            lane_index: HashMap::new(),
            groups: HashMap::new(),
            group_index: HashMap::new(),
            rotation: VecDeque::new(),
            timers: BinaryHeap::new(),
            next_id: 1,
            next_receipt: receipt_seed | 1,
            in_flight: 0,
            slow_in_flight: 0,
            slots: KeptSlots {
                shared: u32::MAX,
                floor: 0,
                slow_memory: 0,
                demoted_per_group: u32::MAX,
                slow_share: u32::MAX,
            },
            held_back: Vec::new(),
        }
    }

    /// Once `slots.shared` messages are in flight in all, hand more only to light
    /// groups (see [`KeptSlots`]), whatever their lanes' caps add up to.
    pub fn keep_last_slots(&mut self, slots: KeptSlots) {
        self.slots = slots;
    }

    /// Whether `group` may have one more message in flight now.
    fn may_take(&self, group: &Group, now: Millis) -> bool {
        if group.slow_until > now {
            // Slow lately: its part of the slow groups' share, never a kept slot.
            self.in_flight < self.slots.shared && self.slow_in_flight < self.slots.slow_share
        } else {
            self.in_flight < self.slots.shared || group.in_flight < self.slots.floor
        }
    }

    /// Messages held, in any state.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// Messages of `group`, in any state.
    pub fn group_len(&self, group: &str) -> u64 {
        self.group_index
            .get(group)
            .and_then(|g| self.groups.get(g))
            .map_or(0, |g| g.len)
    }

    /// Every group with messages, and how many.
    pub fn group_lens(&self) -> Vec<(String, u64)> {
        self.groups
            .values()
            .map(|g| (g.name.clone(), g.len))
            .collect()
    }

    /// Add a message. `limit` is the lane's concurrency cap (the newest message's
    /// word wins: an endpoint's cap can change); a message without a key shares its
    /// group's unlimited lane.
    pub fn insert(
        &mut self,
        id: MessageId,
        group: &str,
        key: Option<&str>,
        limit: u32,
        visible_at: Millis,
        now: Millis,
    ) {
        let lane_id = self.lane_for(group, key);
        let lane = self.lanes.get_mut(&lane_id).expect("just made");
        lane.limit = if key.is_some() {
            limit.max(1)
        } else {
            u32::MAX
        };
        lane.ready.insert((visible_at, id));
        lane.len += 1;
        let group_id = lane.group;
        self.groups.get_mut(&group_id).expect("a lane's group").len += 1;
        self.messages.insert(
            id,
            Message {
                lane: lane_id,
                visible_at,
                in_flight: false,
                demoted: false,
                slow_share: false,
                receipt: 0,
                receive_count: 0,
            },
        );
        self.activate(lane_id, now);
    }

    /// Hand out up to `max` visible messages, fair across groups and across lanes
    /// within a group, each hidden until `visible_until`.
    pub fn receive(&mut self, max: usize, now: Millis, visible_until: Millis) -> Vec<Handout> {
        self.fire_timers(now);
        let mut out = Vec::new();
        while out.len() < max {
            let Some(group_id) = self.rotation.pop_front() else {
                break;
            };
            let Some(group) = self.groups.get_mut(&group_id) else {
                continue;
            };
            group.in_rotation = false;
            if !self.may_take(&self.groups[&group_id], now) {
                // Parked with its lanes still in its rotation; a message leaving
                // its share puts it back (see `leave_share`).
                let group = self.groups.get_mut(&group_id).expect("just read");
                if !group.held_back {
                    group.held_back = true;
                    self.held_back.push(group_id);
                }
                continue;
            }
            let mut taken = None;
            while let Some(lane_id) = self
                .groups
                .get_mut(&group_id)
                .and_then(|g| g.rotation.pop_front())
            {
                let Some(lane) = self.lanes.get_mut(&lane_id) else {
                    continue;
                };
                lane.in_rotation = false;
                if runnable(lane, now) {
                    taken = Some(lane_id);
                    break;
                }
                self.activate(lane_id, now);
            }
            if let Some(lane_id) = taken {
                let slow = self.groups[&group_id].slow_until > now;
                out.push(self.hand_out(lane_id, visible_until, slow));
                self.activate(lane_id, now);
            }
            self.return_to_rotation(group_id);
        }
        out
    }

    /// Hide the message until `visible_at` (it is no longer in flight: waiting out a
    /// delay frees its lane's slot). `false` for a stale receipt or a gone message.
    pub fn change_visibility(
        &mut self,
        id: MessageId,
        receipt: u64,
        visible_at: Millis,
        now: Millis,
    ) -> bool {
        let Some(lane_id) = self.settle(id, receipt) else {
            return false;
        };
        let message = self.messages.get_mut(&id).expect("settled");
        message.visible_at = visible_at;
        self.lanes
            .get_mut(&lane_id)
            .expect("a message's lane")
            .ready
            .insert((visible_at, id));
        self.activate(lane_id, now);
        true
    }

    /// Remove the message. `false` for a stale receipt or a gone message.
    pub fn remove(&mut self, id: MessageId, receipt: u64, now: Millis) -> bool {
        let Some(lane_id) = self.settle(id, receipt) else {
            return false;
        };
        self.messages.remove(&id);
        let lane = self.lanes.get_mut(&lane_id).expect("a message's lane");
        lane.len -= 1;
        let (empty, group_id) = (lane.len == 0, lane.group);
        let group = self.groups.get_mut(&group_id).expect("a lane's group");
        group.len -= 1;
        if empty {
            let lane = self.lanes.remove(&lane_id).expect("present");
            self.lane_index.remove(&lane.key);
            if group.len == 0 {
                let name = std::mem::take(&mut group.name);
                self.groups.remove(&group_id);
                self.group_index.remove(&name);
            }
        } else {
            self.activate(lane_id, now);
        }
        true
    }

    /// Take the message out of flight (or out of the ready set) if `receipt` is its
    /// latest; returns its lane.
    fn settle(&mut self, id: MessageId, receipt: u64) -> Option<LaneId> {
        let message = self.messages.get_mut(&id)?;
        if message.receipt != receipt || receipt == 0 {
            return None;
        }
        let lane_id = message.lane;
        if message.in_flight {
            self.leave_flight(id);
        } else {
            let lane = self.lanes.get_mut(&lane_id).expect("a message's lane");
            lane.ready.remove(&(message.visible_at, id));
        }
        Some(lane_id)
    }

    /// The message `id` (in flight under `receipt`) has run long: its group counts as
    /// slow for `slow_memory` (no kept slots for it), its lane too (its next attempts
    /// start demoted, see [`Self::demote_if_lane_slow`]), and if `may_demote` and the
    /// group has fewer than `demoted_per_group` demoted, the message is demoted: it
    /// no longer counts against its group's share or the shared slots (its attempt
    /// has moved out of the worker's slots), only against its lane's cap. Whether it
    /// was demoted (`false` too for a stale receipt or a settled message).
    pub fn note_slow(
        &mut self,
        id: MessageId,
        receipt: u64,
        now: Millis,
        may_demote: bool,
    ) -> bool {
        let Some(message) = self.messages.get_mut(&id) else {
            return false;
        };
        if !message.in_flight || message.demoted || message.receipt != receipt {
            return false;
        }
        let lane = self.lanes.get_mut(&message.lane).expect("a message's lane");
        lane.slow_until = now + self.slots.slow_memory;
        let group_id = lane.group;
        let group = self.groups.get_mut(&group_id).expect("a lane's group");
        group.slow_until = now + self.slots.slow_memory;
        if may_demote && self.demote(id) {
            return true;
        }
        // It stays, and counts against the slow groups' share from now on.
        let message = self.messages.get_mut(&id).expect("just read");
        if !std::mem::replace(&mut message.slow_share, true) {
            self.slow_in_flight += 1;
        }
        false
    }

    /// The message `id`, just handed out under `receipt`: if its lane ran long lately
    /// (see [`Self::note_slow`]) and `may_demote()` (asked only then: it takes a slow
    /// slot), it is demoted at once, as its attempt will likely run long too. Why not wait for it to: an
    /// endpoint that answers in a few seconds turns over many attempts a second, and
    /// each spent its first moments in a worker slot counted against its tenant's
    /// share, which filled the share and slowed the tenant's quick endpoints to the
    /// slow one's pace. Whether it was demoted.
    pub fn demote_if_lane_slow(
        &mut self,
        id: MessageId,
        receipt: u64,
        now: Millis,
        may_demote: impl FnOnce() -> bool,
    ) -> bool {
        let Some(message) = self.messages.get(&id) else {
            return false;
        };
        if !message.in_flight || message.demoted || message.receipt != receipt {
            return false;
        }
        self.lanes[&message.lane].slow_until > now && may_demote() && self.demote(id)
    }

    /// Demote the message `id` (in flight, not demoted) if its group may have another
    /// demoted: out of its group's share and the shared slots, still against its
    /// lane's cap. Whether it was.
    fn demote(&mut self, id: MessageId) -> bool {
        let message = self.messages.get_mut(&id).expect("a message in flight");
        let group_id = self.lanes[&message.lane].group;
        let group = self.groups.get_mut(&group_id).expect("a lane's group");
        if group.demoted >= self.slots.demoted_per_group {
            return false;
        }
        group.demoted += 1;
        message.demoted = true;
        if std::mem::take(&mut message.slow_share) {
            self.slow_in_flight -= 1;
        }
        self.leave_share(group_id);
        true
    }

    /// The message `id` is no longer in flight. Its group, and the groups held back
    /// for want of a slot, go back in rotation if they have runnable lanes.
    fn leave_flight(&mut self, id: MessageId) {
        let message = self.messages.get_mut(&id).expect("a message in flight");
        message.in_flight = false;
        let demoted = std::mem::take(&mut message.demoted);
        self.slow_in_flight -= u32::from(std::mem::take(&mut message.slow_share));
        let lane_id = message.lane;
        let lane = self.lanes.get_mut(&lane_id).expect("a message's lane");
        lane.in_flight -= 1;
        let group_id = lane.group;
        if demoted {
            // Its share was given back when it was demoted; its lane may run again.
            self.groups
                .get_mut(&group_id)
                .expect("a lane's group")
                .demoted -= 1;
            self.return_to_rotation(group_id);
        } else {
            self.leave_share(group_id);
        }
    }

    /// One of the group's messages no longer counts against its share or the shared
    /// slots.
    fn leave_share(&mut self, group_id: GroupId) {
        self.groups
            .get_mut(&group_id)
            .expect("a lane's group")
            .in_flight -= 1;
        self.in_flight -= 1;
        self.return_to_rotation(group_id);
        // Every place freed is offered to every group held back (one may have become
        // light since: its slowness forgotten); those still not allowed are held
        // back again at the next receive.
        for held in std::mem::take(&mut self.held_back) {
            if let Some(group) = self.groups.get_mut(&held) {
                group.held_back = false;
            }
            self.return_to_rotation(held);
        }
    }

    /// Put the group in the rotation of groups, unless it is there already or has no
    /// runnable lane.
    fn return_to_rotation(&mut self, group_id: GroupId) {
        let Some(group) = self.groups.get_mut(&group_id) else {
            return;
        };
        if !group.in_rotation && !group.rotation.is_empty() {
            group.in_rotation = true;
            self.rotation.push_back(group_id);
        }
    }

    fn hand_out(&mut self, lane_id: LaneId, visible_until: Millis, slow: bool) -> Handout {
        let lane = self.lanes.get_mut(&lane_id).expect("runnable lane");
        let (_, id) = lane.ready.pop_first().expect("runnable lane has a head");
        lane.in_flight += 1;
        let group_id = lane.group;
        self.groups
            .get_mut(&group_id)
            .expect("a lane's group")
            .in_flight += 1;
        self.in_flight += 1;
        self.next_receipt = self.next_receipt.wrapping_add(2);
        let receipt = self.next_receipt;
        let message = self.messages.get_mut(&id).expect("a lane's message");
        message.in_flight = true;
        message.slow_share = slow;
        self.slow_in_flight += u32::from(slow);
        message.visible_at = visible_until;
        message.receipt = receipt;
        message.receive_count += 1;
        self.timers
            .push(Reverse((visible_until, Timer::Expiry(id, receipt))));
        Handout {
            id,
            receipt,
            receive_count: message.receive_count,
        }
    }

    /// Put the lane where it belongs: in its group's rotation when runnable, on a
    /// timer when its head is delayed, parked when saturated or empty.
    fn activate(&mut self, lane_id: LaneId, now: Millis) {
        let Some(lane) = self.lanes.get_mut(&lane_id) else {
            return;
        };
        if lane.in_rotation || lane.in_flight >= lane.limit {
            return;
        }
        let Some(&(head, _)) = lane.ready.first() else {
            return;
        };
        if head > now {
            if lane.timer_at.is_none_or(|t| head < t) {
                lane.timer_at = Some(head);
                self.timers.push(Reverse((head, Timer::Lane(lane_id))));
            }
            return;
        }
        lane.in_rotation = true;
        let group_id = lane.group;
        let group = self.groups.get_mut(&group_id).expect("a lane's group");
        group.rotation.push_back(lane_id);
        self.return_to_rotation(group_id);
    }

    fn fire_timers(&mut self, now: Millis) {
        while let Some(&Reverse((at, timer))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            match timer {
                Timer::Lane(lane_id) => {
                    let Some(lane) = self.lanes.get_mut(&lane_id) else {
                        continue;
                    };
                    if lane.timer_at == Some(at) {
                        lane.timer_at = None;
                    }
                    self.activate(lane_id, now);
                }
                Timer::Expiry(id, receipt) => {
                    let Some(message) = self.messages.get_mut(&id) else {
                        continue;
                    };
                    if !message.in_flight || message.receipt != receipt {
                        continue;
                    }
                    // Not settled in time: visible again, as SQS does.
                    let (lane_id, visible_at) = (message.lane, message.visible_at);
                    self.leave_flight(id);
                    let lane = self.lanes.get_mut(&lane_id).expect("a message's lane");
                    lane.ready.insert((visible_at, id));
                    self.activate(lane_id, now);
                }
            }
        }
    }

    fn lane_for(&mut self, group: &str, key: Option<&str>) -> LaneId {
        let lane_key = (group.to_owned(), key.map(str::to_owned));
        if let Some(id) = self.lane_index.get(&lane_key) {
            return *id;
        }
        let group_id = match self.group_index.get(group) {
            Some(id) => *id,
            None => {
                let id = self.fresh_id();
                self.group_index.insert(group.to_owned(), id);
                self.groups.insert(
                    id,
                    Group {
                        name: group.to_owned(),
                        rotation: VecDeque::new(),
                        in_rotation: false,
                        len: 0,
                        in_flight: 0,
                        held_back: false,
                        demoted: 0,
                        slow_until: Millis::MIN,
                    },
                );
                id
            }
        };
        let id = self.fresh_id();
        self.lane_index.insert(lane_key.clone(), id);
        self.lanes.insert(
            id,
            Lane {
                group: group_id,
                key: lane_key,
                limit: u32::MAX,
                ready: BTreeSet::new(),
                in_flight: 0,
                len: 0,
                in_rotation: false,
                timer_at: None,
                slow_until: Millis::MIN,
            },
        );
        id
    }

    /// Ids are never reused, so a stale rotation or timer entry can never point at a
    /// newer lane or group.
    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

fn runnable(lane: &Lane, now: Millis) -> bool {
    lane.in_flight < lane.limit && lane.ready.first().is_some_and(|(t, _)| *t <= now)
}

#[cfg(test)]
#[path = "lanes_tests.rs"]
mod tests;
