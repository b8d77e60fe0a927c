//! The scheduler's kept places and slow share: slow groups held to their share,
//! lanes slow or quick lately, groups not yet proven quick.

use super::tests::{ids, kept, VIS};
use super::*;

#[test]
fn a_slow_group_gets_no_kept_place_and_a_bounded_number_demoted() {
    let mut s = Scheduler::new(1);
    s.keep_last_slots(kept(2, 2));
    for id in 0..10 {
        s.insert(id, "hangs", Some(&format!("e{id}")), 8, 0, 0);
    }
    let first = s.receive(64, 0, VIS);
    assert_eq!(
        first.len(),
        2,
        "a group that fills the shared places takes no kept one"
    );
    // Slow, but not to be demoted (no slow slot free): only remembered as slow.
    assert!(!s.note_slow(first[0].id, first[0].receipt, 10, false));
    s.insert(100, "light", Some("x"), 8, 10, 10);
    let light = s.receive(64, 10, VIS);
    assert_eq!(ids(&light), vec![100], "a light group takes a kept one");
    // Demoted, up to 3 of the group's: each frees a shared place it takes again.
    let mut demoted = 0;
    let mut running = first.clone();
    while let Some(h) = running.pop() {
        if s.note_slow(h.id, h.receipt, 20, true) {
            demoted += 1;
            running.extend(s.receive(64, 20, VIS));
        }
    }
    assert_eq!(demoted, 3, "at most 3 demoted per group");
    // The shared places are taken (one of its own, the light group's): below its
    // floor, but slow lately, it gets no kept place; a light group does.
    assert!(s.receive(64, 30, VIS).is_empty());
    s.insert(101, "light", Some("x"), 8, 30, 30);
    assert_eq!(ids(&s.receive(64, 30, VIS)), vec![101]);
    // Once its slowness is forgotten, a freed place goes to it again, and a kept
    // one too (it is below its floor).
    assert!(s.remove(light[0].id, light[0].receipt, 1_100));
    assert_eq!(s.receive(64, 1_100, VIS).len(), 1);
    assert_eq!(s.receive(64, 1_100, VIS).len(), 0, "at its floor");
}

#[test]
fn slow_groups_hold_at_most_their_share_and_a_busy_quick_group_the_rest() {
    let mut s = Scheduler::new(1);
    s.keep_last_slots(KeptSlots {
        slow_share: 3,
        ..kept(8, 2)
    });
    for id in 0..20 {
        s.insert(id, "hangs", Some("x"), 256, 0, 0);
    }
    let first = s.receive(1, 0, VIS);
    // Noted slow, but no slow slot to move to: it stays, and counts against the share.
    assert!(!s.note_slow(first[0].id, first[0].receipt, 0, false));
    let more = s.receive(64, 0, VIS);
    assert_eq!(more.len(), 2, "the slow groups' share of 3, with the first");
    assert!(
        s.receive(64, 0, VIS).is_empty(),
        "shared places are free, the share is not"
    );
    // A busy quick group takes the rest of the shared places (it is past its floor).
    for id in 0..20 {
        s.insert(100 + id, "busy", Some("y"), 256, 1, 1);
    }
    let busy = s.receive(64, 1, VIS);
    assert_eq!(busy.len(), 5);
    // A place the busy group frees is its own again; one the slow group frees, the
    // slow group's.
    assert!(s.remove(busy[0].id, busy[0].receipt, 2));
    let again = ids(&s.receive(64, 2, VIS));
    assert!(again.len() == 1 && again[0] >= 100, "{again:?}");
    assert!(s.remove(more[0].id, more[0].receipt, 3));
    let next = s.receive(64, 3, VIS);
    assert_eq!(next.len(), 1);
    assert!(next[0].id < 100, "{:?}", ids(&next));
}

#[test]
fn a_lane_slow_lately_starts_its_next_messages_demoted() {
    let mut s = Scheduler::new(1);
    s.keep_last_slots(KeptSlots {
        slow_share: 2,
        ..kept(4, 1)
    });
    for id in 0..10 {
        s.insert(id, "t", Some("slow"), 8, 0, 0);
    }
    let first = s.receive(1, 0, VIS);
    assert!(
        !s.demote_if_lane_slow(first[0].id, first[0].receipt, 0, || true),
        "nothing ran long yet"
    );
    // It runs long and moves out (1 of the group's 3 demoted); its lane is remembered.
    assert!(s.note_slow(first[0].id, first[0].receipt, 10, true));
    let next = s.receive(4, 10, VIS);
    assert_eq!(ids(&next), vec![1, 2], "the slow groups' share of 2");
    assert!(
        !s.demote_if_lane_slow(next[0].id, next[0].receipt, 10, || false),
        "no slow slot free"
    );
    assert!(s.demote_if_lane_slow(next[0].id, next[0].receipt, 10, || true));
    assert!(
        !s.demote_if_lane_slow(next[0].id, next[0].receipt, 10, || true),
        "once"
    );
    assert!(
        !s.demote_if_lane_slow(next[1].id, next[1].receipt + 2, 10, || true),
        "a stale receipt"
    );
    // The place it left in the share goes to the lane's next message.
    let freed = s.receive(4, 10, VIS);
    assert_eq!(ids(&freed), vec![3]);
    assert!(s.demote_if_lane_slow(freed[0].id, freed[0].receipt, 10, || true));
    // Past the group's 3 demoted, a slow lane's message stays in the share, and the
    // group gets no other place there: it would find no slow slot either.
    assert!(!s.demote_if_lane_slow(next[1].id, next[1].receipt, 10, || true));
    assert!(
        s.receive(4, 10, VIS).is_empty(),
        "the share: 2, and no more"
    );
    // Once the slowness is forgotten, the lane's messages start in the shared places
    // (looked at again as a place frees).
    assert!(s.remove(next[1].id, next[1].receipt, 2_000));
    let later = s.receive(4, 2_000, VIS);
    assert_eq!(ids(&later), vec![4, 5, 6, 7], "the 4 shared places");
    assert!(!s.demote_if_lane_slow(later[0].id, later[0].receipt, 2_000, || panic!("asked")));
}

#[test]
fn a_lane_proven_quick_is_not_held_to_its_slow_groups_share_even_between_messages() {
    let mut s = Scheduler::new(1);
    s.keep_last_slots(KeptSlots {
        slow_share: 2,
        ..kept(8, 1)
    });
    for id in 0..10 {
        s.insert(id, "t", Some("slow"), 8, 0, 0);
    }
    for id in 100..107 {
        s.insert(id, "t", Some("quick"), 8, 0, 0);
    }
    let first = s.receive(1, 0, VIS);
    // Slow, with no slow slot to move to: it stays, in the slow groups' share.
    assert!(!s.note_slow(first[0].id, first[0].receipt, 10, false));
    // The quick lane has proven nothing yet: one probe, outside the share (the slow
    // lane takes the share's last place); its next message is held to the share.
    let unproven = s.receive(8, 10, VIS);
    assert_eq!(ids(&unproven), vec![100, 1]);
    assert!(s.receive(8, 10, VIS).is_empty(), "the slow share is full");
    // Settled within 100 ms: proven quick, it takes shared places beside the share.
    assert!(s.remove(unproven[0].id, unproven[0].receipt, 20));
    let next = s.receive(8, 20, VIS);
    assert_eq!(ids(&next), vec![101, 102, 103, 104, 105, 106]);
    assert!(
        s.receive(8, 20, VIS).is_empty(),
        "the shared places are taken"
    );
    // Its lane empties; what it proved is kept with it, so a message arriving later
    // is not held to the share (which 0 and 1 still fill).
    for h in &next {
        assert!(s.remove(h.id, h.receipt, 30));
    }
    assert_eq!(s.lanes.len(), 2, "the empty quick lane is kept");
    s.insert(200, "t", Some("quick"), 8, 40, 40);
    assert_eq!(ids(&s.receive(8, 40, VIS)), vec![200]);
    assert!(s.remove(200, s.messages[&200].receipt, 45));
    // Once what it proved has run out, the empty lane is forgotten.
    assert!(s.receive(0, 1_000, VIS).is_empty());
    assert_eq!(s.lanes.len(), 2, "still proven");
    assert!(s.receive(0, 2_000, VIS).is_empty());
    assert_eq!(s.lanes.len(), 1);
    assert_eq!(s.group_lens(), vec![("t".to_owned(), 10)]);
}

#[test]
fn a_quick_lane_behind_every_other_lane_of_its_group_held_to_the_share_runs_at_once() {
    let mut s = Scheduler::new(1);
    s.keep_last_slots(KeptSlots {
        slow_share: 1,
        ..kept(200, 1)
    });
    s.insert(1_000, "t", Some("quick"), 8, 0, 0);
    let quick = s.receive(1, 0, VIS);
    assert!(s.remove(quick[0].id, quick[0].receipt, 1), "proven quick");
    // 99 more endpoints (a tenant has 100 at most), two messages each: the first of
    // each in flight, then one runs long, which fills the slow share (1).
    for id in 0..99 {
        for n in [id, 100 + id] {
            s.insert(n, "t", Some(&format!("e{id}")), 8, 2, 2);
        }
    }
    let first = s.receive(99, 2, VIS);
    assert_eq!(first.len(), 99, "one of each lane, in turn");
    assert!(!s.note_slow(first[0].id, first[0].receipt, 3, false));
    s.insert(1_001, "t", Some("quick"), 8, 3, 3);
    // Every lane before the quick one is held to the share (slow, or with its probe
    // in flight): passed over, all in one turn.
    assert_eq!(ids(&s.receive(8, 4, VIS)), vec![1_001]);
    assert!(s.receive(8, 4, VIS).is_empty());
}

/// Slow groups share the slow share: one holds at most its part of it, so another
/// slow group's lane still runs (one tenant hanging on many endpoints held all of
/// it, and another's 2 s endpoint went from 2 deliveries a second to 0.13, a hostile
/// test). A group with all its demoted gets none of it.
#[test]
fn slow_groups_share_the_slow_share() {
    let mut s = Scheduler::new(1);
    s.keep_last_slots(KeptSlots {
        slow_share: 6,
        slow_share_per_group: 2,
        demoted_per_group: 1,
        ..kept(100, 1)
    });
    for id in 0..40 {
        s.insert(id, "hangs", Some("h"), 256, 0, 0);
        s.insert(200 + id, "other", Some("o"), 256, 0, 0);
    }
    for id in 100..110 {
        s.insert(id, "patient", Some("p"), 4, 0, 0);
    }
    // Each group noted slow: one message each runs long. The hanging group's is
    // demoted (its one demoted); the others' find no slow slot.
    let mut first = s.receive(3, 0, VIS);
    first.sort_by_key(|h| h.id);
    assert_eq!(ids(&first), vec![0, 100, 200]);
    assert!(s.note_slow(first[0].id, first[0].receipt, 10, true));
    assert!(!s.note_slow(first[1].id, first[1].receipt, 10, false));
    assert!(!s.note_slow(first[2].id, first[2].receipt, 10, false));
    // The hanging group has all its demoted: no place in the share for it. The two
    // others have one place each there, and get one more each, not the whole share.
    let mut next = s.receive(10, 10, VIS);
    next.sort_by_key(|h| h.id);
    assert_eq!(ids(&next), vec![101, 201]);
    assert!(
        s.receive(10, 10, VIS).is_empty(),
        "4 of the share's 6 taken"
    );
    // Its demoted message ends: the hanging group's next ones may run, up to its
    // part of the share (the runtime moves the first out as it starts, see
    // `demote_if_lane_slow`; the second stays).
    assert!(s.remove(first[0].id, first[0].receipt, 20));
    assert_eq!(ids(&s.receive(10, 20, VIS)), vec![1, 2]);
    // One of the patient group's ends: its next runs.
    assert!(s.remove(next[0].id, next[0].receipt, 20));
    assert_eq!(ids(&s.receive(10, 20, VIS)), vec![102]);
    assert!(s.receive(10, 20, VIS).is_empty(), "the whole share taken");
}

/// Groups not yet known slow may take kept places; when their attempts run long and
/// no slow slot is free, those in kept places move out all the same (once, while the
/// move's place is there and the group's demoted cap allows), the others stay.
#[test]
fn attempts_in_kept_places_move_out_without_a_slow_slot() {
    let mut s = Scheduler::new(1);
    // One shared place... but a demoted cap of 3 a group (see `kept`).
    s.keep_last_slots(kept(1, 5));
    for id in 0..10 {
        s.insert(id, "hangs", Some("h"), 256, 0, 0);
    }
    let out = s.receive(5, 0, VIS);
    assert_eq!(ids(&out), vec![0, 1, 2, 3, 4]);
    for h in &out {
        assert!(
            !s.note_slow(h.id, h.receipt, 10, false),
            "no slow slot free"
        );
    }
    let mut asked = 0;
    let mut moved = Vec::new();
    for h in &out {
        if s.demote_from_kept_place(h.id, h.receipt, || {
            asked += 1;
            true
        }) {
            moved.push(h.id);
        }
    }
    assert_eq!(moved, vec![1, 2, 3], "the kept ones, up to the demoted cap");
    assert_eq!(asked, 4, "never asked for the one in the shared place");
    assert!(
        !s.demote_from_kept_place(out[1].id, out[1].receipt, || true),
        "moved once"
    );
    assert!(
        !s.demote_from_kept_place(out[4].id, out[4].receipt, || false),
        "no place to move to"
    );
    // The moved ones no longer count against the worker's places, the two left do.
    assert_eq!(s.in_flight, 2);
    assert_eq!(s.groups.values().map(|g| g.demoted).sum::<u32>(), 3);
}

/// Past the shared places, a group none of whose lanes has proven quick lately gets
/// `unproven_floor` kept places, not `floor`: new groups whose endpoints hang cannot
/// each take `floor` of them before any is known slow. One attempt ended in time
/// proves the group, which then gets `floor`.
#[test]
fn groups_not_yet_proven_quick_get_fewer_kept_places() {
    let mut s = Scheduler::new(1);
    s.keep_last_slots(KeptSlots {
        unproven_floor: 1,
        ..kept(1, 3)
    });
    for id in 0..10 {
        s.insert(id, "first", Some("f"), 256, 0, 0);
        s.insert(100 + id, "new", Some("n"), 256, 0, 0);
    }
    let mut out = s.receive(10, 0, VIS);
    out.sort_by_key(|h| h.id);
    // The one shared place, then a kept place for a group with nothing in flight.
    assert_eq!(ids(&out), vec![0, 100]);
    assert!(s.receive(10, 0, VIS).is_empty());
    // The new group's attempt ends in time (within 100 ms): proven, it may have
    // three in flight.
    let new = out.iter().find(|h| h.id == 100).unwrap();
    assert!(s.remove(new.id, new.receipt, 50));
    assert_eq!(ids(&s.receive(10, 50, VIS)), vec![101, 102, 103]);
    assert!(s.receive(10, 50, VIS).is_empty());
}
