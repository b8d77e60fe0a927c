//! The hostile tests' findings about the database file: one server per file, whatever
//! name reaches it, and a file opened only by the name its unfinished log is under.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::harness::*;

/// How long a start that is refused may take to end: one still running after this
/// was served, and is killed so the test fails instead of hanging.
const REFUSED_WITHIN: Duration = Duration::from_secs(15);

/// `entrega serve` on `db` and `listen`, which must be refused: what it said on stderr.
fn serve_refused(db: &Path, listen: &str) -> String {
    let mut child = std::process::Command::new(entrega_bin())
        .args(["serve", "--listen", listen, "--db"])
        .arg(db)
        .env("ENTREGA_ADMIN_KEY", ADMIN_KEY)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > REFUSED_WITHIN {
            let _ = child.kill();
            panic!("{} was served, not refused", db.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "{} was served", db.display());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A second server through a symlink or a hard link to the same file is refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_server_through_a_link_to_the_same_database_is_refused() {
    let dir = TempDir::new("links");
    let _first = Server::start(&dir);
    let db = dir.0.join("entrega.db");
    let symlink = dir.0.join("symlink.db");
    let hardlink = dir.0.join("hardlink.db");
    std::os::unix::fs::symlink(&db, &symlink).unwrap();
    std::fs::hard_link(&db, &hardlink).unwrap();
    for link in [&db, &symlink, &hardlink] {
        let err = serve_refused(link, "127.0.0.1:0");
        assert!(
            err.contains("another entrega process is using the database"),
            "{err}"
        );
    }
}

/// After a crash, the database through another name (a hard link) is refused while the
/// log left under the first name may hold its last writes; by that name it serves, and
/// keeps them. And a start that cannot listen leaves no database file behind.
#[tokio::test(flavor = "multi_thread")]
async fn a_crashed_database_is_not_opened_by_another_name_of_it() {
    let dir = TempDir::new("crash-link");
    let mut first = Server::start(&dir);
    let (tenant, _) = first.admin().tenant("Acme").await;
    first.kill_hard();
    let db = dir.0.join("entrega.db");
    let hardlink = dir.0.join("hardlink.db");
    std::fs::hard_link(&db, &hardlink).unwrap();
    let err = serve_refused(&hardlink, "127.0.0.1:0");
    assert!(
        err.contains("is the same file as") && err.contains(&format!("--db {}", db.display())),
        "{err}"
    );
    let again = Server::start(&dir);
    let (status, got) = again.admin().get(&format!("/v1/tenants/{tenant}")).await;
    assert_eq!(
        status, 200,
        "the crashed server's last write is kept: {got}"
    );

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let fresh = dir.0.join("never.db");
    let err = serve_refused(&fresh, &taken.local_addr().unwrap().to_string());
    assert!(err.contains("cannot listen"), "{err}");
    assert!(
        !fresh.exists(),
        "a start that could not listen made {}",
        fresh.display()
    );
}
