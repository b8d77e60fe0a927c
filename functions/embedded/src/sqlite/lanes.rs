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
//! ([`Scheduler::demote_if_lane_slow`]), while a lane proven quick is not held to its
//! slow tenant's share: a tenant's quick endpoints keep their pace beside its slow
//! ones (the rules are in [`slots`]).
//!
//! The scheduler holds no bodies and does no I/O; the SQLite queue persists every
//! message and rebuilds this at start-up (only one process may open the database, so
//! memory and file cannot disagree across processes).

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, VecDeque};

mod slots;
mod state;
pub use slots::KeptSlots;
use slots::Places;
use state::runnable;

/// Lanes of a group passed over in one turn at most, looking for one that may run
/// (proven quick, in a group held to the slow share): bounds what a receive costs for
/// a group with many lanes held back; the lanes further on are looked at in its next
/// turns (passed-over lanes go to the back of its rotation). A tenant's endpoints all
/// fit: with fewer, its quick endpoint behind many slow ones waited a turn per 16,
/// and a turn comes only as a place frees.
const LANES_PASSED_OVER_PER_TURN: usize = entrega_core::endpoint::MAX_ENDPOINTS_PER_TENANT;

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
    /// When it was last handed out.
    handed_at: Millis,
    /// Its attempt's request is over (the response is in, or it was never sent): in
    /// flight until settled, but no longer against its lane's cap
    /// ([`Scheduler::request_over`]).
    request_over: bool,
    /// Handed out into one of the kept places (the shared ones all taken): see
    /// [`Scheduler::demote_from_kept_place`].
    in_kept_place: bool,
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
    /// Until when one of its attempts counts as having ended in time lately.
    quick_until: Millis,
    /// When a pending timer retires it, if it is still empty then (see
    /// [`Scheduler::retire_if_idle`]).
    retire_at: Option<Millis>,
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
    /// Its messages counted against the slow share (`KeptSlots::slow_share_per_group`).
    slow_in_flight: u32,
    /// Until when it counts as slow: one of its attempts ran long lately.
    slow_until: Millis,
    /// Until when it counts as proven quick: one of its lanes' attempts ended in time
    /// lately (see `KeptSlots::unproven_floor`).
    quick_until: Millis,
    /// Its lanes, empty ones kept for what they proved included.
    lanes: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// A lane's head becomes visible.
    Lane(LaneId),
    /// A received message's visibility timeout runs out (if the receipt is current).
    Expiry(MessageId, u64),
    /// An empty lane is forgotten, if what it proved has run out.
    Retire(LaneId),
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
            slots: KeptSlots::NONE,
            held_back: Vec::new(),
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
            .filter(|g| g.len > 0)
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
                handed_at: 0,
                in_kept_place: false,
                request_over: false,
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
            match self.next_lane(group_id, now) {
                Turn::Take(lane_id, slow_share) => {
                    out.push(self.hand_out(lane_id, now, visible_until, slow_share));
                    self.activate(lane_id, now);
                    self.return_to_rotation(group_id);
                }
                Turn::HeldBack => {
                    // Parked with its lanes still in its rotation; a message leaving
                    // its share puts it back (see `leave_share`).
                    let group = self.groups.get_mut(&group_id).expect("just read");
                    if !group.held_back {
                        group.held_back = true;
                        self.held_back.push(group_id);
                    }
                }
                Turn::Idle => {}
            }
        }
        out
    }

    /// The group's next lane that is runnable and may have another message in flight
    /// now (and whether that counts against the slow share), taken from its rotation.
    fn next_lane(&mut self, group_id: GroupId, now: Millis) -> Turn {
        let mut passed_over = 0;
        let in_turn = self.groups[&group_id].rotation.len();
        for _ in 0..in_turn {
            let Some(lane_id) = self
                .groups
                .get_mut(&group_id)
                .and_then(|g| g.rotation.pop_front())
            else {
                break;
            };
            let Some(lane) = self.lanes.get_mut(&lane_id) else {
                continue;
            };
            lane.in_rotation = false;
            if !runnable(lane, now) {
                self.activate(lane_id, now);
                continue;
            }
            let (group, lane) = (&self.groups[&group_id], &self.lanes[&lane_id]);
            let places = Self::places_for(group, lane, now);
            if self.may_take(group, places) {
                return Turn::Take(lane_id, places == Places::SlowShare);
            }
            // Not now: behind the group's other lanes, one of which may (a lane proven
            // quick, or on its probe, when this one is held to the slow share).
            let quick_may = places == Places::SlowShare && self.may_take(group, Places::Shared);
            self.lanes.get_mut(&lane_id).expect("just read").in_rotation = true;
            self.groups
                .get_mut(&group_id)
                .expect("just read")
                .rotation
                .push_back(lane_id);
            passed_over += 1;
            if !quick_may || passed_over == LANES_PASSED_OVER_PER_TURN {
                break;
            }
        }
        if passed_over > 0 {
            Turn::HeldBack
        } else {
            Turn::Idle
        }
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
        let Some(lane_id) = self.settle(id, receipt, now) else {
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

    /// The request of the message's attempt is over (the response is in): its lane
    /// may hand out another message now, while the outcome is still being written.
    /// The lane's cap bounds the requests its endpoint answers at once; held until the
    /// message was settled, the place also waited out the outcome's write and the
    /// disk's sync, which at an endpoint's default cap of 8 was a quarter of the rate.
    /// `false` for a stale receipt, a message not in flight, or one already over.
    pub fn request_over(&mut self, id: MessageId, receipt: u64, now: Millis) -> bool {
        let Some(message) = self.messages.get_mut(&id) else {
            return false;
        };
        if !message.in_flight || message.receipt != receipt || message.request_over {
            return false;
        }
        message.request_over = true;
        let lane_id = message.lane;
        self.lanes
            .get_mut(&lane_id)
            .expect("a message's lane")
            .in_flight -= 1;
        self.activate(lane_id, now);
        true
    }

    /// Remove the message. `false` for a stale receipt or a gone message.
    pub fn remove(&mut self, id: MessageId, receipt: u64, now: Millis) -> bool {
        let Some(lane_id) = self.settle(id, receipt, now) else {
            return false;
        };
        self.messages.remove(&id);
        let lane = self.lanes.get_mut(&lane_id).expect("a message's lane");
        lane.len -= 1;
        let (empty, group_id) = (lane.len == 0, lane.group);
        self.groups.get_mut(&group_id).expect("a lane's group").len -= 1;
        if empty {
            self.retire_if_idle(lane_id, now);
        } else {
            self.activate(lane_id, now);
        }
        true
    }
}

/// What a group's turn in a receive comes to.
enum Turn {
    /// A message of this lane, counted against the slow share or not.
    Take(LaneId, bool),
    /// It has runnable lanes, none of which may have another in flight now.
    HeldBack,
    /// It has no runnable lane.
    Idle,
}

#[cfg(test)]
#[path = "lanes_slow_tests.rs"]
mod slow_tests;
#[cfg(test)]
#[path = "lanes_tests.rs"]
mod tests;
