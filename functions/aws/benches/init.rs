//! Each Lambda function's size and init time: how long its bootstrap takes from exec to
//! asking the Lambda Runtime API for its first event (logs set up, the environment
//! read, the SDK configured, every client built). The Runtime API is played by a stub
//! on loopback that records the first `GET …/invocation/next` and never answers it.
//!
//! Build the bootstraps first, then run the bench:
//!
//! ```sh
//! cargo build --release -p outbox-trigger -p delivery-worker -p dlq-analyzer -p api
//! cargo bench -p entrega-aws --bench init
//! ```
//!
//! `ENTREGA_BOOTSTRAP_DIR` names another directory of binaries (default
//! `target/release`); sizes of the arm64 bootstraps `sam build` or `cargo lambda build`
//! made under `target/lambda/<function>/bootstrap` are printed beside, when present.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const FUNCTIONS: [&str; 4] = ["outbox-trigger", "delivery-worker", "dlq-analyzer", "api"];
/// Cold starts measured per function.
const RUNS: usize = 15;
/// A bootstrap that has not asked for an event by then is reported as failing.
const INIT_LIMIT: Duration = Duration::from_secs(10);

/// What the template hands every function (names only: init makes no AWS call).
const ENVIRONMENT: [(&str, &str); 17] = [
    ("AWS_REGION", "us-east-1"),
    ("AWS_ACCESS_KEY_ID", "bench"),
    ("AWS_SECRET_ACCESS_KEY", "bench"),
    ("AWS_LAMBDA_FUNCTION_NAME", "entrega-bench"),
    ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256"),
    ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST"),
    ("ENTREGA_MAIN_TABLE", "entrega-main"),
    ("ENTREGA_OUTBOX_TABLE", "entrega-outbox"),
    (
        "ENTREGA_DELIVERY_QUEUE_URL",
        "https://sqs.us-east-1.amazonaws.com/1/d",
    ),
    ("ENTREGA_DELIVERY_QUEUE_ARN", "arn:aws:sqs:us-east-1:1:d"),
    ("ENTREGA_DELIVERY_DLQ_ARN", "arn:aws:sqs:us-east-1:1:dd"),
    (
        "ENTREGA_FAILURE_QUEUE_URL",
        "https://sqs.us-east-1.amazonaws.com/1/f",
    ),
    (
        "ENTREGA_OUTBOX_DLQ_URL",
        "https://sqs.us-east-1.amazonaws.com/1/o",
    ),
    ("ENTREGA_SCHEDULE_GROUP", "entrega"),
    ("ENTREGA_SCHEDULER_ROLE_ARN", "arn:aws:iam::1:role/s"),
    (
        "ENTREGA_NOTIFICATION_TOPIC_ARN",
        "arn:aws:sns:us-east-1:1:n",
    ),
    ("ENTREGA_NOTICE_FROM", "notices@example.com"),
];

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::var_os("ENTREGA_BOOTSTRAP_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/release"));
    println!(
        "{:<16} {:>12} {:>12} {:>10} {:>10} {:>10}",
        "function", "size", "arm64 size", "init p50", "init p90", "init max"
    );
    for function in FUNCTIONS {
        let binary = dir.join(function);
        if !binary.exists() {
            eprintln!(
                "{} is missing: cargo build --release -p {function}",
                binary.display()
            );
            std::process::exit(2);
        }
        let arm64 = root.join(format!("target/lambda/{function}/bootstrap"));
        let mut inits: Vec<Duration> = (0..RUNS).map(|_| init_time(&binary)).collect();
        inits.sort();
        println!(
            "{:<16} {:>12} {:>12} {:>10} {:>10} {:>10}",
            function,
            megabytes(&binary),
            if arm64.exists() {
                megabytes(&arm64)
            } else {
                "-".into()
            },
            millis(inits[RUNS / 2]),
            millis(inits[RUNS * 9 / 10]),
            millis(inits[RUNS - 1]),
        );
    }
}

/// Exec → first `GET /2018-06-01/runtime/invocation/next`.
fn init_time(binary: &Path) -> Duration {
    let api = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let address = api.local_addr().expect("bound");
    let started = Instant::now();
    let mut child = Command::new(binary)
        .envs(ENVIRONMENT)
        .env("AWS_LAMBDA_RUNTIME_API", address.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the bootstrap starts");
    api.set_nonblocking(true).expect("non-blocking");
    let asked = loop {
        match api.accept() {
            Ok((mut connection, _)) => {
                connection.set_nonblocking(false).expect("blocking");
                let mut request = [0u8; 256];
                let read = connection.read(&mut request).unwrap_or(0);
                let line = String::from_utf8_lossy(&request[..read]);
                assert!(
                    line.contains("/runtime/invocation/next"),
                    "the first call to the Runtime API asks for an event: {line}"
                );
                break started.elapsed();
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if started.elapsed() > INIT_LIMIT {
                    let _ = child.kill();
                    panic!(
                        "{} did not ask for an event within {INIT_LIMIT:?}",
                        binary.display()
                    );
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    asked
}

fn megabytes(path: &Path) -> String {
    let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    format!("{:.2} MB", bytes as f64 / 1_000_000.0)
}

fn millis(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}
