//! The scheduler's rules for the worker's slots: who may have another message in
//! flight, and which attempts move out of the worker's slots (see the parent module's
//! docs for why).
//!
//! Slowness is remembered per group (tenant) and per lane (endpoint). A group slow
//! lately gets no kept slot, and its lanes share the slow groups' share, but for a
//! lane *proven quick* (its attempts lately ended in time and none ran long) and a
//! lane that has proven nothing lately, for one attempt at a time (its *probe*). So a
//! tenant's quick endpoint keeps its pace beside its own slow ones, however many, and
//! beside other tenants' hanging ones, even when the share is taken for a long while
//! (a probe waited for the share before: 18 s behind attempts hanging 25 s). A tenant
//! spraying hanging endpoints gets one probe each, each noted slow after a second
//! (and at most 100 endpoints a tenant).

use super::{Group, GroupId, Lane, Message, MessageId, Millis, Scheduler};

/// See [`Scheduler::keep_last_slots`].
#[derive(Debug, Clone, Copy)]
pub struct KeptSlots {
    /// In flight in all past which only light groups get another message: groups
    /// with fewer than `floor` in flight that have not been slow for `slow_memory`.
    pub shared: u32,
    pub floor: u32,
    /// `floor` for a group none of whose lanes has proven quick lately: a group is
    /// known slow only once an attempt has run long, so new groups whose endpoints
    /// hang, arriving together, take kept places first, each as many as it may.
    pub unproven_floor: u32,
    pub slow_memory: Millis,
    /// An attempt settled sooner than this after it was handed out proves its lane
    /// quick (for `slow_memory`).
    pub quick_within: Millis,
    /// Most demoted messages one group may have.
    pub demoted_per_group: u32,
    /// Most messages of groups slow lately in flight at once (but demoted ones, and
    /// those of lanes proven quick or on their probe): they share this many of the
    /// shared slots, so attempts that neither end nor move out (the slow slots all
    /// taken) cannot crowd out quick ones.
    pub slow_share: u32,
    /// Most of the slow share one group may hold, so slow groups share it: one tenant
    /// hanging on many endpoints held all of it for its whole timeout, and another's
    /// endpoint answering in 2 s went from 2 deliveries a second to 0.13 (a hostile
    /// test). A group that already has `demoted_per_group` demoted gets none of it
    /// either: its next message would find no slow slot to move to and hold its
    /// place in the share for as long as it hangs.
    pub slow_share_per_group: u32,
}

/// The places a message may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Places {
    /// A group not slow lately: the shared places, or a kept one while it is light
    /// (`proven`: one of its lanes proved quick lately, so `floor` applies, not
    /// `unproven_floor`).
    Any { proven: bool },
    /// A lane of a group slow lately, proven quick or on its probe: the shared places
    /// (never a kept one: those are for groups not slow lately).
    Shared,
    /// Any other lane of a group slow lately: the slow groups' share of the shared
    /// places.
    SlowShare,
}

impl KeptSlots {
    /// No slot kept, nothing slow: every lane limited by its cap only.
    pub(super) const NONE: Self = Self {
        shared: u32::MAX,
        floor: 0,
        unproven_floor: 0,
        slow_memory: 0,
        quick_within: 0,
        demoted_per_group: u32::MAX,
        slow_share: u32::MAX,
        slow_share_per_group: u32::MAX,
    };
}

impl Scheduler {
    /// Once `slots.shared` messages are in flight in all, hand more only to light
    /// groups (see [`KeptSlots`]), whatever their lanes' caps add up to.
    pub fn keep_last_slots(&mut self, slots: KeptSlots) {
        self.slots = slots;
    }

    /// Which places a message of `lane` may take now.
    pub(super) fn places_for(group: &Group, lane: &Lane, now: Millis) -> Places {
        if group.slow_until <= now {
            return Places::Any {
                proven: group.quick_until > now,
            };
        }
        let slow = lane.slow_until > now;
        let quick = lane.quick_until > now && !slow;
        let probe = !slow && !quick && lane.in_flight == 0;
        if quick || probe {
            Places::Shared
        } else {
            Places::SlowShare
        }
    }

    /// Whether one more message of `group` may be in flight now, in `places`.
    pub(super) fn may_take(&self, group: &Group, places: Places) -> bool {
        let shared = self.in_flight < self.slots.shared;
        match places {
            Places::Any { proven } => {
                let floor = if proven {
                    self.slots.floor
                } else {
                    self.slots.unproven_floor
                };
                shared || group.in_flight < floor
            }
            Places::Shared => shared,
            Places::SlowShare => {
                shared
                    && self.slow_in_flight < self.slots.slow_share
                    && group.slow_in_flight < self.slots.slow_share_per_group
                    && group.demoted < self.slots.demoted_per_group
            }
        }
    }

    /// The message `id` counts against the slow share from now on (`true`) or no
    /// longer does (`false`); the scheduler's count and its group's follow.
    pub(super) fn set_slow_share(&mut self, id: MessageId, counted: bool) {
        let message = self
            .messages
            .get_mut(&id)
            .expect("a message of the scheduler");
        if std::mem::replace(&mut message.slow_share, counted) == counted {
            return;
        }
        let group_id = self.lanes[&message.lane].group;
        let group = self.groups.get_mut(&group_id).expect("a lane's group");
        if counted {
            self.slow_in_flight += 1;
            group.slow_in_flight += 1;
        } else {
            self.slow_in_flight -= 1;
            group.slow_in_flight -= 1;
        }
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
        self.set_slow_share(id, true);
        false
    }

    /// The message `id`, just handed out under `receipt`: if its lane ran long lately
    /// (see [`Self::note_slow`]) and `may_demote()` (asked only then: it takes a slow
    /// slot), it is demoted at once, as its attempt will likely run long too. Why not
    /// wait for it to: an endpoint that answers in a few seconds turns over many
    /// attempts a second, and each spent its first moments in a worker slot counted
    /// against its tenant's share, which filled the share and slowed the tenant's
    /// quick endpoints to the slow one's pace. Whether it was demoted.
    pub fn demote_if_lane_slow(
        &mut self,
        id: MessageId,
        receipt: u64,
        now: Millis,
        may_demote: impl FnOnce() -> bool,
    ) -> bool {
        let Some(message) = self.undemoted_in_flight(id, receipt) else {
            return false;
        };
        self.lanes[&message.lane].slow_until > now && may_demote() && self.demote(id)
    }

    /// The message `id` (in flight under `receipt`) was noted slow (see
    /// [`Self::note_slow`]) and not demoted, no slow slot being free, but it was handed
    /// out into a kept place: demote it all the same if `may_move()` (asked only then:
    /// it takes a place of the moves out of kept places). Why: a group is known slow
    /// only once one of its attempts has run long, so tenants whose endpoints hang,
    /// new ones arriving together, may each take kept places first; when the slow
    /// slots are all taken, those attempts held the kept places for their whole
    /// timeout, and another tenant's quick attempt waited 20 s (a fairness test, on a
    /// loaded machine). Whether it was demoted.
    pub fn demote_from_kept_place(
        &mut self,
        id: MessageId,
        receipt: u64,
        may_move: impl FnOnce() -> bool,
    ) -> bool {
        let Some(message) = self.undemoted_in_flight(id, receipt) else {
            return false;
        };
        message.in_kept_place && may_move() && self.demote(id)
    }

    /// The message `id`, if it is in flight under `receipt` and not demoted (a stale
    /// receipt, a settled message or a demoted one has nothing left to move).
    fn undemoted_in_flight(&self, id: MessageId, receipt: u64) -> Option<&Message> {
        self.messages
            .get(&id)
            .filter(|m| m.in_flight && !m.demoted && m.receipt == receipt)
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
        self.set_slow_share(id, false);
        self.leave_share(group_id);
        true
    }

    /// The message `id` is leaving flight `settled` at `now` (not by its visibility
    /// running out): ended within `quick_within` of its hand-out, it proves its lane
    /// quick.
    pub(super) fn note_quick(&mut self, id: MessageId, now: Millis) {
        let message = &self.messages[&id];
        if now - message.handed_at < self.slots.quick_within {
            let lane = self.lanes.get_mut(&message.lane).expect("a message's lane");
            lane.quick_until = now + self.slots.slow_memory;
            let group = self.groups.get_mut(&lane.group).expect("a lane's group");
            group.quick_until = now + self.slots.slow_memory;
        }
    }

    /// One of the group's messages no longer counts against its share or the shared
    /// slots.
    pub(super) fn leave_share(&mut self, group_id: GroupId) {
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
}
