//! The writer's choice of sync per commit: only a group of nothing but replayable work
//! commits without waiting for the disk.

use super::*;

/// `PRAGMA synchronous` as a write job sees it: 1 is NORMAL, 2 is FULL.
async fn sync_seen(db: &SqliteDb) -> i64 {
    db.call(|conn| Ok(conn.pragma_query_value(None, "synchronous", |r| r.get(0))?))
        .await
        .unwrap()
}

#[tokio::test]
async fn only_replayable_work_commits_without_a_sync() {
    let dir = entrega_testkit::TempDir::new("db-sync");
    let db = SqliteDb::open_with(&dir.0.join("e.db"), Durability::Full).unwrap();
    assert_eq!(sync_seen(&db).await, 2, "a plain write is durable");
    assert_eq!(
        replayable(sync_seen(&db)).await,
        1,
        "a replayable one is not"
    );
    assert_eq!(sync_seen(&db).await, 2, "and the next plain one is again");

    // A durable caller grouped with replayable ones still commits durably.
    let (_, _, durable) = tokio::join!(
        replayable(sync_seen(&db)),
        replayable(sync_seen(&db)),
        sync_seen(&db)
    );
    assert_eq!(durable, 2);
}

#[tokio::test]
async fn normal_durability_never_syncs_a_commit() {
    let dir = entrega_testkit::TempDir::new("db-sync-normal");
    let db = SqliteDb::open_with(&dir.0.join("e.db"), Durability::Normal).unwrap();
    assert_eq!(sync_seen(&db).await, 1);
    assert_eq!(replayable(sync_seen(&db)).await, 1);
}
