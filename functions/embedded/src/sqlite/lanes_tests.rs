use super::*;

const VIS: Millis = 60_000;

/// `shared` places, then `floor` for light groups; slowness (and quickness: settled
/// within 100 ms) remembered 1 s, and at most 3 demoted per group.
fn kept(shared: u32, floor: u32) -> KeptSlots {
    KeptSlots {
        shared,
        floor,
        unproven_floor: floor,
        slow_memory: 1_000,
        quick_within: 100,
        demoted_per_group: 3,
        slow_share: u32::MAX,
        slow_share_per_group: u32::MAX,
    }
}

fn ids(handouts: &[Handout]) -> Vec<MessageId> {
    handouts.iter().map(|h| h.id).collect()
}

#[test]
fn receiving_is_round_robin_over_groups_then_over_lanes() {
    let mut s = Scheduler::new(1);
    // Tenant a: endpoint x has 1..=3, endpoint y has 10, 11; tenant b: 20, 21.
    for id in 1..=3 {
        s.insert(id, "a", Some("x"), 8, 0, 0);
    }
    s.insert(10, "a", Some("y"), 8, 0, 0);
    s.insert(11, "a", Some("y"), 8, 0, 0);
    s.insert(20, "b", Some("z"), 8, 0, 0);
    s.insert(21, "b", Some("z"), 8, 0, 0);
    let got = ids(&s.receive(7, 0, VIS));
    assert_eq!(got, vec![1, 20, 10, 21, 2, 11, 3]);
    assert!(s.receive(5, 0, VIS).is_empty());
}

#[test]
fn a_saturated_lane_with_a_huge_backlog_never_delays_its_groups_other_lanes() {
    let mut s = Scheduler::new(1);
    for id in 0..50_000 {
        s.insert(id, "tenant", Some("slow"), 1, 0, 0);
    }
    let first = s.receive(64, 0, VIS);
    assert_eq!(ids(&first), vec![0], "the cap of 1 holds");
    s.insert(1_000_000, "tenant", Some("fast"), 8, 1, 1);
    assert_eq!(ids(&s.receive(64, 1, VIS)), vec![1_000_000]);
    assert_eq!(s.group_len("tenant"), 50_001);
    // The slow lane's slot frees when its message is settled, and only then.
    assert!(s.receive(64, 2, VIS).is_empty());
    assert!(s.remove(0, first[0].receipt, 3));
    assert_eq!(ids(&s.receive(64, 3, VIS)), vec![1]);
}

#[test]
fn an_unsettled_message_comes_back_after_its_visibility_and_old_receipts_are_stale() {
    let mut s = Scheduler::new(1);
    s.insert(1, "g", Some("k"), 1, 0, 0);
    let first = s.receive(1, 0, 100)[0];
    assert!(s.receive(1, 99, 200).is_empty(), "hidden until 100");
    let second = s.receive(1, 100, 200)[0];
    assert_eq!(second.id, 1);
    assert_eq!(second.receive_count, 2);
    assert_ne!(first.receipt, second.receipt);
    assert!(
        !s.remove(1, first.receipt, 101),
        "a stale receipt deletes nothing"
    );
    assert!(!s.change_visibility(1, first.receipt, 5_000, 101));
    assert!(s.remove(1, second.receipt, 101));
    assert!(s.is_empty());
    assert_eq!(s.group_len("g"), 0);
}

#[test]
fn delayed_messages_wait_and_a_changed_visibility_frees_the_slot() {
    let mut s = Scheduler::new(1);
    s.insert(1, "g", Some("k"), 1, 500, 0);
    s.insert(2, "g", Some("k"), 1, 0, 0);
    let got = s.receive(5, 0, VIS);
    assert_eq!(ids(&got), vec![2], "1 is not visible before 500");
    // Waiting out a retry delay is not being in flight.
    assert!(s.change_visibility(2, got[0].receipt, 1_000, 10));
    assert!(s.receive(5, 499, VIS).is_empty());
    assert_eq!(ids(&s.receive(5, 500, VIS)), vec![1]);
    assert!(s.receive(5, 999, VIS).is_empty(), "1 holds the only slot");
}

#[test]
fn keyless_messages_are_not_capped() {
    let mut s = Scheduler::new(1);
    for id in 0..5 {
        s.insert(id, "g", None, 0, 0, 0);
    }
    assert_eq!(s.receive(10, 0, VIS).len(), 5);
}

#[test]
fn a_receipt_stays_valid_after_expiry_until_the_message_is_received_again() {
    // SQS: the latest receipt handle works even once its visibility has run out.
    let mut s = Scheduler::new(1);
    s.insert(1, "g", Some("k"), 1, 0, 0);
    let h = s.receive(1, 0, 10)[0];
    assert!(s.receive(1, 5, 20).is_empty());
    assert_eq!(
        ids(&s.receive(1, 11, 20)),
        vec![1],
        "expired: visible again"
    );
    // Received again: the first receipt is stale now.
    assert!(!s.remove(1, h.receipt, 12));
    let mut s = Scheduler::new(1);
    s.insert(1, "g", Some("k"), 1, 0, 0);
    let h = s.receive(1, 0, 10)[0];
    let _ = s.receive(0, 11, 20);
    assert!(s.remove(1, h.receipt, 12), "expired but not received again");
}

#[test]
fn past_the_shared_slots_only_groups_with_little_in_flight_are_served() {
    let mut s = Scheduler::new(1);
    // 4 shared places, then only groups with fewer than 2 in flight.
    s.keep_last_slots(kept(4, 2));
    // Two greedy tenants, each with lanes whose caps add up to far more than 4.
    for id in 0..100 {
        let key = if id % 2 == 0 { "x" } else { "y" };
        s.insert(id, "greedy-a", Some(key), 256, 0, 0);
        s.insert(1_000 + id, "greedy-b", Some(key), 256, 0, 0);
    }
    let first = s.receive(64, 0, VIS);
    assert_eq!(
        first.len(),
        4,
        "the shared places, then each has 2: none of the kept"
    );
    let a = first.iter().filter(|h| h.id < 1_000).count();
    assert_eq!(a, 2, "shared in turn");
    // A third tenant, with nothing in flight, gets kept places, up to 2.
    for id in 0..5 {
        s.insert(10_000 + id, "light", Some("z"), 8, 1, 1);
    }
    assert_eq!(ids(&s.receive(64, 1, VIS)), vec![10_000, 10_001]);
    assert!(s.receive(64, 2, VIS).is_empty());
    // A settled message leaves its greedy tenant below 2 in flight: it takes one
    // more, and no more (the total is still past the shared places).
    assert!(s.remove(first[0].id, first[0].receipt, 3));
    assert_eq!(s.receive(64, 3, VIS).len(), 1);
    assert!(s.receive(64, 4, VIS).is_empty());
    // A message hidden for a retry is no longer in flight either.
    assert!(s.change_visibility(first[1].id, first[1].receipt, 1_000_000, 5));
    assert_eq!(s.receive(64, 5, VIS).len(), 1);
    // Messages whose visibility ran out come back, freeing their places: the same
    // shares again.
    let again = s.receive(64, 10 + VIS, VIS);
    let light = again.iter().filter(|h| h.id >= 10_000).count();
    assert_eq!((again.len(), light), (6, 2), "{:?}", ids(&again));
}

#[test]
fn a_demoted_message_gives_back_its_groups_share_but_not_its_lanes_cap() {
    let mut s = Scheduler::new(1);
    s.keep_last_slots(kept(2, 1));
    for id in 0..10 {
        s.insert(id, "slow", Some("x"), 3, 0, 0);
    }
    let first = s.receive(64, 0, VIS);
    assert_eq!(first.len(), 2, "the shared places");
    assert!(s.receive(64, 0, VIS).is_empty());
    // Both demoted: the shares are free again, but the lane's cap of 3 counts them.
    assert!(s.note_slow(first[0].id, first[0].receipt, 0, true));
    assert!(s.note_slow(first[1].id, first[1].receipt, 0, true));
    assert!(!s.note_slow(first[1].id, first[1].receipt, 0, true), "once");
    assert_eq!(s.receive(64, 1, VIS).len(), 1, "the lane's third and last");
    // Settling a demoted message frees its lane's place, and no share twice.
    assert!(s.remove(first[0].id, first[0].receipt, 2));
    assert_eq!(s.receive(64, 2, VIS).len(), 1);
    assert!(s.receive(64, 2, VIS).is_empty());
    assert!(
        !s.note_slow(first[0].id, first[0].receipt, 2, true),
        "settled"
    );
    // A demoted message whose visibility runs out frees its lane's place as well.
    let later = s.receive(64, 10 + VIS, VIS);
    assert_eq!(later.len(), 2, "shares again: {:?}", ids(&later));
}

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

/// A lane's place goes back when its message's request is over, before the message
/// is settled; settling it later does not give the place back a second time.
#[test]
fn a_request_over_frees_its_lanes_place_once() {
    let mut s = Scheduler::new(1);
    for id in 1..=3 {
        s.insert(id, "tenant", Some("endpoint"), 1, 0, 0);
    }
    let first = s.receive(8, 0, VIS);
    assert_eq!(ids(&first), vec![1], "the cap of 1 holds");
    assert!(
        !s.request_over(1, first[0].receipt + 1, 1),
        "a stale receipt"
    );
    assert!(s.receive(8, 1, VIS).is_empty());

    assert!(s.request_over(1, first[0].receipt, 2));
    assert!(!s.request_over(1, first[0].receipt, 2), "once");
    let second = s.receive(8, 2, VIS);
    assert_eq!(
        ids(&second),
        vec![2],
        "the place is free while 1 is recorded"
    );

    // 1 settled: its place was given back already, so 2 still holds the only one.
    assert!(s.remove(1, first[0].receipt, 3));
    assert!(
        s.receive(8, 3, VIS).is_empty(),
        "no second place from the settle"
    );
    // 2's visibility runs out (its request was never over): its place frees then,
    // the one place.
    let third = s.receive(8, 3 + VIS, VIS);
    assert_eq!(third.len(), 1, "{third:?}");
    assert!(
        !s.request_over(2, second[0].receipt, 3 + VIS),
        "a stale receipt"
    );
}
