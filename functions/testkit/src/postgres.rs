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
    /// Who runs the server programs, when the tests run as root; else the caller.
    run_as: Option<&'static str>,
    pub port: u16,
    /// With TLS: the certificate of the CA that signed the server's (a client trusts it
    /// through `SSL_CERT_FILE`).
    pub certificate: Option<PathBuf>,
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
        Self::start_with(false)
    }

    /// The same, serving TLS with a fresh self-signed certificate for `127.0.0.1`.
    pub fn start_with_tls() -> Self {
        Self::start_with(true)
    }

    fn start_with(tls: bool) -> Self {
        let bin = bin_dir();
        let dir = TempDir::new("pg");
        let port = crate::free_loopback_port();
        let mut cluster = Self {
            bin,
            dir,
            run_as: is_root().then(server_user),
            port,
            certificate: None,
        };
        cluster.hand_over(&cluster.dir.0);
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
        let mut options = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -k {} -c max_connections=50",
            cluster.dir.0.display()
        );
        if tls {
            let (ca, cert, key) = cluster.self_signed(&data);
            options += &format!(
                " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                cert.display(),
                key.display()
            );
            cluster.certificate = Some(ca);
        }
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

    /// A throw-away CA (its certificate is returned, for a client to trust) and a
    /// server certificate for `127.0.0.1` it signed, in the data directory; the key is
    /// readable by the server's user alone (PostgreSQL refuses it otherwise). A
    /// verifying client refuses a self-signed server certificate used as its own root.
    fn self_signed(&self, data: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let file = |name: &str| self.dir.0.join(name).to_str().unwrap().to_owned();
        let (ca, ca_key, csr, ext) = (file("ca.crt"), file("ca.key"), file("s.csr"), file("s.ext"));
        let cert = data.join("server.crt").to_str().unwrap().to_owned();
        let key = data.join("server.key").to_str().unwrap().to_owned();
        std::fs::write(&ext, "subjectAltName=IP:127.0.0.1\n").unwrap();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .output()
                .expect("openssl runs");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=Entrega test CA",
            "-keyout",
            &ca_key,
            "-out",
            &ca,
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            &key,
            "-out",
            &csr,
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &cert,
        ]);
        self.hand_over(Path::new(&cert));
        self.hand_over(Path::new(&key));
        let status = Command::new("chmod").arg("600").arg(&key).status().unwrap();
        assert!(status.success());
        (ca.into(), cert.into(), key.into())
    }

    /// `postgres://user@127.0.0.1:port/postgres`.
    pub fn url_as(&self, user: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/postgres", self.port)
    }

    /// The superuser's URL.
    pub fn url(&self) -> String {
        self.url_as(SUPERUSER)
    }

    /// Give `path` (recursively) to the server's user, where it is not the caller.
    fn hand_over(&self, path: &Path) {
        let Some(user) = self.run_as else {
            return;
        };
        let status = Command::new("chown")
            .args(["-R", user])
            .arg(path)
            .status()
            .expect("chown runs");
        assert!(status.success(), "{} is handed to {user}", path.display());
    }

    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        match self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(path);
                c
            }
            None => Command::new(path),
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
