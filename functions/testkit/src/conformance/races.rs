//! Writers racing on one record: exactly one wins each race, and no attempt is lost.

use entrega_core::delivery::{Attempt, Delivery};
use entrega_core::ports::{Store, StoreError};

use super::{attempt, fresh_delivery};

/// How many writers race in [`racing_writers_of_one_record_have_one_winner`].
const RACERS: usize = 8;

/// Writers racing on one record, all at once: one creates the delivery, one claims the
/// key (every other claimant is told the winner's value), and of saves made from the
/// same read exactly one lands. Every racer's attempt is recorded, a loser's too (it
/// happened), and an attempt saved again under its id stays one record.
pub async fn racing_writers_of_one_record_have_one_winner(store: &dyn Store) {
    use futures_util::future::join_all;

    let (_, endpoint, fresh) = fresh_delivery(store).await;
    let id = fresh.id.clone();
    let created = join_all((0..RACERS).map(|_| store.create_delivery_if_absent(&fresh))).await;
    let created: Vec<bool> = created.into_iter().map(|r| r.unwrap().1).collect();
    assert_eq!(
        created.iter().filter(|c| **c).count(),
        1,
        "created once: {created:?}"
    );

    let key = format!("claim#{}", rand::random::<u64>());
    let ttl = std::time::Duration::from_secs(60);
    let values: Vec<String> = (0..RACERS).map(|i| format!("holder-{i}")).collect();
    let claims = join_all(values.iter().map(|v| store.remember_once(&key, v, ttl))).await;
    let claims: Vec<Option<String>> = claims.into_iter().map(Result::unwrap).collect();
    let winners: Vec<&String> = values
        .iter()
        .zip(&claims)
        .filter(|(_, c)| c.is_none())
        .map(|(v, _)| v)
        .collect();
    assert_eq!(winners.len(), 1, "one claim taken: {claims:?}");
    assert!(
        claims.iter().flatten().all(|c| c == winners[0]),
        "every loser is told the winner: {claims:?}"
    );

    let read = store.get_delivery(&id).await.unwrap().unwrap();
    let racers: Vec<(Delivery, Attempt)> = (0..RACERS)
        .map(|i| {
            let mut mine = read.clone();
            mine.attempt_count = i as u32 + 1;
            (mine, attempt(&fresh, &endpoint, i as u32 + 1))
        })
        .collect();
    let saves = join_all(
        racers
            .iter()
            .map(|(mine, attempt)| store.save_delivery(mine, std::slice::from_ref(attempt))),
    )
    .await;
    let landed: Vec<&Delivery> = saves.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(landed.len(), 1, "one save from the same read lands");
    assert!(
        saves
            .iter()
            .all(|r| matches!(r, Ok(_) | Err(StoreError::Conflict(_)))),
        "the others are conflicts"
    );
    let stored = store.get_delivery(&id).await.unwrap().unwrap();
    assert_eq!(stored.version, read.version + 1);
    assert_eq!(
        stored.attempt_count, landed[0].attempt_count,
        "the winner's write is kept"
    );
    let recorded = |attempts: Vec<Attempt>| {
        let mut numbers: Vec<u32> = attempts.iter().map(|a| a.number).collect();
        numbers.sort_unstable();
        numbers
    };
    let every_racer: Vec<u32> = (1..=RACERS as u32).collect();
    assert_eq!(
        recorded(store.list_attempts(&id).await.unwrap()),
        every_racer,
        "every racer's attempt is recorded once, a loser's too"
    );
    let (late, attempt) = &racers[0];
    let again = store
        .save_delivery(late, std::slice::from_ref(attempt))
        .await;
    assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
    assert_eq!(
        recorded(store.list_attempts(&id).await.unwrap()),
        every_racer,
        "an attempt saved again stays one record"
    );
}
