//! A throw-away PostgreSQL server for tests and benches: a fresh cluster in a temporary
//! directory, listening on a free loopback port (and a Unix socket in that directory),
//! stopped and deleted when dropped. It runs Debian's `postgresql` binaries (which
//! `scripts/postgres-tools` unpacks into the checkout on a machine that lacks them);
//! as root, it runs them as the `postgres` user (or `nobody` where there is none),
//! since PostgreSQL refuses to run as root.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::TempDir;

/// The superuser of a test cluster (trust authentication, loopback only).
pub const SUPERUSER: &str = "entrega_test";

/// A running test cluster.
pub struct PgCluster {
    bin: PathBuf,
    dir: TempDir,
    pub port: u16,
}

/// Where `initdb` and `pg_ctl` are: `ENTREGA_PG_BIN`, else the newest
/// `/usr/lib/postgresql/<version>/bin`, else the `PATH`.
fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("ENTREGA_PG_BIN") {
        return dir.into();
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_default()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

/// Who runs the server when the tests run as root: PostgreSQL refuses root.
fn server_user() -> &'static str {
    let has_postgres = Command::new("id")
        .arg("postgres")
        .output()
        .is_ok_and(|o| o.status.success());
    if has_postgres {
        "postgres"
    } else {
        "nobody"
    }
}

impl PgCluster {
    /// Create and start a cluster; panics, saying what is missing, if it cannot.
    pub fn start() -> Self {
        let bin = bin_dir();
        let dir = TempDir::new("pg");
        let port = crate::free_loopback_port();
        let root = is_root();
        if root {
            let status = Command::new("chown")
                .args(["-R", server_user()])
                .arg(&dir.0)
                .status()
                .expect("chown runs");
            assert!(
                status.success(),
                "the server's directory is handed to its user"
            );
        }
        let cluster = Self { bin, dir, port };
        let data = cluster.dir.0.join("data");
        cluster.run(
            "initdb",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-U".as_ref(),
                SUPERUSER.as_ref(),
                "--auth=trust".as_ref(),
                "-E".as_ref(),
                "UTF8".as_ref(),
                "--no-sync".as_ref(),
            ],
        );
        let options = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -k {} -c max_connections=50",
            cluster.dir.0.display()
        );
        let log = cluster.dir.0.join("postgres.log");
        cluster.run(
            "pg_ctl",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-l".as_ref(),
                log.as_os_str(),
                "-o".as_ref(),
                options.as_ref(),
                "-w".as_ref(),
                "start".as_ref(),
            ],
        );
        cluster
    }

    /// `postgres://user@127.0.0.1:port/postgres`.
    pub fn url_as(&self, user: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/postgres", self.port)
    }

    /// The superuser's URL.
    pub fn url(&self) -> String {
        self.url_as(SUPERUSER)
    }

    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", server_user(), "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    fn run(&self, program: &str, args: &[&std::ffi::OsStr]) {
        let out = self
            .command(program)
            .args(args)
            .current_dir(Path::new("/"))
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "{program} of PostgreSQL (in `{}`) does not start: {e}; install Debian's \
                     `postgresql` package or set ENTREGA_PG_BIN",
                    self.bin.display()
                )
            });
        assert!(
            out.status.success(),
            "{program} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let data = self.dir.0.join("data");
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&data)
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}
