//! The scheduler's bookkeeping: messages in and out of flight, lanes in and out of
//! their group's rotation (runnable, on a timer, or parked), and lanes and groups
//! made and forgotten.

use std::cmp::Reverse;
use std::collections::{BTreeSet, VecDeque};

use super::{Group, GroupId, Handout, Lane, LaneId, MessageId, Millis, Scheduler, Timer};

impl Scheduler {
    /// Forget the lane if it is empty, and its group with its last lane; but while
    /// what the lane proved (quick, or slow) still counts, keep it, empty, until then.
    /// Why: a tenant's quick endpoint that gets one event at a time empties its lane
    /// after each, and, forgotten, would have to prove itself again every time.
    pub(super) fn retire_if_idle(&mut self, lane_id: LaneId, now: Millis) {
        let Some(lane) = self.lanes.get_mut(&lane_id) else {
            return;
        };
        if lane.len > 0 {
            return;
        }
        let proven_until = lane.quick_until.max(lane.slow_until);
        if proven_until > now {
            if lane.retire_at.is_none() {
                lane.retire_at = Some(proven_until);
                self.timers
                    .push(Reverse((proven_until, Timer::Retire(lane_id))));
            }
            return;
        }
        let lane = self.lanes.remove(&lane_id).expect("present");
        self.lane_index.remove(&lane.key);
        let group = self.groups.get_mut(&lane.group).expect("a lane's group");
        group.lanes -= 1;
        if group.lanes == 0 {
            let name = std::mem::take(&mut group.name);
            self.groups.remove(&lane.group);
            self.group_index.remove(&name);
        }
    }

    /// Take the message out of flight (or out of the ready set) if `receipt` is its
    /// latest; returns its lane.
    pub(super) fn settle(&mut self, id: MessageId, receipt: u64, now: Millis) -> Option<LaneId> {
        let message = self.messages.get_mut(&id)?;
        if message.receipt != receipt || receipt == 0 {
            return None;
        }
        let lane_id = message.lane;
        if message.in_flight {
            self.note_quick(id, now);
            self.leave_flight(id);
        } else {
            let lane = self.lanes.get_mut(&lane_id).expect("a message's lane");
            lane.ready.remove(&(message.visible_at, id));
        }
        Some(lane_id)
    }

    /// The message `id` is no longer in flight. Its group, and the groups held back
    /// for want of a slot, go back in rotation if they have runnable lanes.
    fn leave_flight(&mut self, id: MessageId) {
        let message = self.messages.get_mut(&id).expect("a message in flight");
        message.in_flight = false;
        let demoted = std::mem::take(&mut message.demoted);
        // Its lane's place was given back already when its request was over.
        let place_given_back = std::mem::take(&mut message.request_over);
        let lane_id = message.lane;
        self.set_slow_share(id, false);
        let lane = self.lanes.get_mut(&lane_id).expect("a message's lane");
        if !place_given_back {
            lane.in_flight -= 1;
        }
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

    /// Put the group in the rotation of groups, unless it is there already or has no
    /// runnable lane.
    pub(super) fn return_to_rotation(&mut self, group_id: GroupId) {
        let Some(group) = self.groups.get_mut(&group_id) else {
            return;
        };
        if !group.in_rotation && !group.rotation.is_empty() {
            group.in_rotation = true;
            self.rotation.push_back(group_id);
        }
    }

    pub(super) fn hand_out(
        &mut self,
        lane_id: LaneId,
        now: Millis,
        visible_until: Millis,
        slow: bool,
    ) -> Handout {
        let lane = self.lanes.get_mut(&lane_id).expect("runnable lane");
        let (_, id) = lane.ready.pop_first().expect("runnable lane has a head");
        lane.in_flight += 1;
        let group_id = lane.group;
        self.groups
            .get_mut(&group_id)
            .expect("a lane's group")
            .in_flight += 1;
        let in_kept_place = self.in_flight >= self.slots.shared;
        self.in_flight += 1;
        self.next_receipt = self.next_receipt.wrapping_add(2);
        let receipt = self.next_receipt;
        let message = self.messages.get_mut(&id).expect("a lane's message");
        message.in_flight = true;
        message.visible_at = visible_until;
        message.receipt = receipt;
        message.receive_count += 1;
        message.handed_at = now;
        message.in_kept_place = in_kept_place;
        let receive_count = message.receive_count;
        self.timers
            .push(Reverse((visible_until, Timer::Expiry(id, receipt))));
        self.set_slow_share(id, slow);
        Handout {
            id,
            receipt,
            receive_count,
        }
    }

    /// Put the lane where it belongs: in its group's rotation when runnable, on a
    /// timer when its head is delayed, parked when saturated or empty.
    pub(super) fn activate(&mut self, lane_id: LaneId, now: Millis) {
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

    pub(super) fn fire_timers(&mut self, now: Millis) {
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
                Timer::Retire(lane_id) => {
                    if let Some(lane) = self.lanes.get_mut(&lane_id) {
                        lane.retire_at = None;
                        self.retire_if_idle(lane_id, now);
                    }
                }
            }
        }
    }

    pub(super) fn lane_for(&mut self, group: &str, key: Option<&str>) -> LaneId {
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
                        slow_in_flight: 0,
                        slow_until: Millis::MIN,
                        quick_until: Millis::MIN,
                        lanes: 0,
                    },
                );
                id
            }
        };
        let id = self.fresh_id();
        self.groups.get_mut(&group_id).expect("just found").lanes += 1;
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
                quick_until: Millis::MIN,
                retire_at: None,
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

pub(super) fn runnable(lane: &Lane, now: Millis) -> bool {
    lane.in_flight < lane.limit && lane.ready.first().is_some_and(|(t, _)| *t <= now)
}
