//! The scheduler's lanes: round robin over groups then lanes, caps, visibility and
//! receipts (its kept places and slow share: `lanes_slow_tests.rs`).

use super::*;

pub(super) const VIS: Millis = 60_000;

/// `shared` places, then `floor` for light groups; slowness (and quickness: settled
/// within 100 ms) remembered 1 s, and at most 3 demoted per group.
pub(super) fn kept(shared: u32, floor: u32) -> KeptSlots {
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

pub(super) fn ids(handouts: &[Handout]) -> Vec<MessageId> {
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
