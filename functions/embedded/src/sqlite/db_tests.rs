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

/// A database in `dir` with a table `t` of integer keys.
async fn with_table_t(dir: &entrega_testkit::TempDir) -> SqliteDb {
    let db = SqliteDb::open(&dir.0.join("t.db")).unwrap();
    db.call(|conn| Ok(conn.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY)")?))
        .await
        .unwrap();
    db
}

/// The keys in table `t`, in order.
async fn keys(db: &SqliteDb) -> Vec<i64> {
    db.call(|conn| {
        let mut stmt = conn.prepare("SELECT k FROM t ORDER BY k")?;
        let keys = stmt
            .query_map([], |r| r.get(0))?
            .collect::<Result<Vec<i64>, _>>()?;
        Ok(keys)
    })
    .await
    .unwrap()
}

/// The jobs of a group run straight into one transaction: one that fails is rolled
/// back alone, the others commit, and the work run again for it (the group re-run,
/// each job in a savepoint) has its once-only step done once.
#[tokio::test]
async fn a_failing_write_is_rolled_back_alone_and_the_rest_commit_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = entrega_testkit::TempDir::new("db-group");
    let db = with_table_t(&dir).await;
    // Hold the writer, so that the writes below queue up and go in one group.
    let hold = {
        let db = db.clone();
        tokio::spawn(async move {
            db.call(|_| {
                std::thread::sleep(std::time::Duration::from_millis(300));
                Ok(())
            })
            .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let (runs, counted) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    {
        let (runs, counted) = (runs.clone(), counted.clone());
        db.call_detached(
            "insert 1",
            move |conn| {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(conn.execute("INSERT INTO t VALUES (1)", [])?)
            },
            move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
            },
        );
    }
    let failing = db.call(|conn| {
        conn.execute("INSERT INTO t VALUES (2)", [])?;
        Err::<(), _>(DbError::Conflict("refused after writing".into()))
    });
    let fine = db.call(|conn| Ok(conn.execute("INSERT INTO t VALUES (3)", [])?));
    let (failing, fine) = tokio::join!(failing, fine);
    hold.await.unwrap().unwrap();
    assert!(matches!(failing, Err(StoreError::Conflict(_))));
    assert_eq!(fine.unwrap(), 1);
    assert!(db.writes_failing(), "a write failed in the last group");
    assert_eq!(
        keys(&db).await,
        [1, 3],
        "the failed write's row is not kept"
    );
    assert!(
        db.writes_failing(),
        "and still a moment later, though the group after it committed"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the group ran a second time"
    );
    assert_eq!(
        counted.load(Ordering::SeqCst),
        1,
        "its once-only step ran once"
    );
}

/// A write queued ahead is committed before a write its caller makes next, though
/// nobody waited for it.
#[tokio::test]
async fn a_write_queued_ahead_lands_before_the_next() {
    let dir = entrega_testkit::TempDir::new("db-ahead");
    let db = with_table_t(&dir).await;
    for k in 0..50_i64 {
        let landed = db
            .call_ahead(move |conn| Ok(conn.execute("INSERT INTO t VALUES (?1)", [k])?))
            .await
            .unwrap();
        let found: i64 = db
            .call(move |conn| {
                Ok(conn.query_row("SELECT COUNT(*) FROM t WHERE k = ?1", [k], |r| r.get(0))?)
            })
            .await
            .unwrap();
        assert_eq!(found, 1, "write {k} landed before the one after it");
        assert_eq!(landed.await.unwrap(), 1, "and says so");
    }
}
