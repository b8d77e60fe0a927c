//! The README's walkthrough ("A first webhook"), run as written so it cannot rot:
//! every fenced block of that section, in order, on a fresh database, with only the
//! ports substituted.
//!
//! - ```` ```sh ```` is terminal 2: one long-lived `bash` that runs each block in turn,
//!   so variables carry over as they do for a reader.
//! - ```` ```sh terminal-N ```` starts a long-running command (the server, the receiver)
//!   in terminal N; a second one there first stops the first with Ctrl-C (SIGINT).
//! - ```` ```text ```` after a block is what it must print; ```` ```text terminal-N ````
//!   is what terminal N must print soon after the previous step. Each line is matched
//!   in order (other lines may come between), runs of spaces stand for any spacing,
//!   and `…` for anything; `ent_…`, `dlv_…`, `whsec_…` and the like capture the value,
//!   and a later command's `dlv_…` is replaced by the value captured last, as a reader
//!   would paste it.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use regex_lite::Regex;

use crate::harness::*;

/// The section of the README that is run.
const SECTION: &str = "## A first webhook";
/// How long a step's expected output may take to appear (deliveries, retries 1 s apart).
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// The ports the README names, replaced by free ones.
const README_API_PORT: &str = "8787";
const README_RECEIVER_PORT: &str = "9000";

#[derive(Debug)]
struct Block {
    lang: String,
    /// 2 unless the info string names another terminal.
    terminal: u8,
    body: String,
}

fn blocks(readme: &str) -> Vec<Block> {
    let start = readme
        .find(SECTION)
        .expect("the README has the walkthrough");
    let rest = &readme[start + SECTION.len()..];
    let section = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    let mut blocks = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.strip_prefix("```").filter(|i| !i.is_empty()) else {
            continue;
        };
        let mut words = info.split_whitespace();
        let lang = words.next().unwrap_or_default().to_owned();
        let terminal = words
            .find_map(|w| w.strip_prefix("terminal-"))
            .map(|n| n.parse().expect("terminal-N"))
            .unwrap_or(2);
        let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
        blocks.push(Block {
            lang,
            terminal,
            body: body.join("\n"),
        });
    }
    blocks
}

/// Output collected from a child's stdout (stderr is merged into it).
#[derive(Clone, Default)]
struct Output(Arc<Mutex<String>>);

impl Output {
    fn collect(&self, mut from: impl Read + Send + 'static) {
        let sink = self.0.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = from.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
    }

    fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }
}

/// The environment every terminal shares: `entrega` on the PATH, the substituted
/// ports, a fresh working directory, and none of the test's own `ENTREGA_*` settings.
fn command(program: &str, dir: &Path, bin: &Path, api_port: u16) -> Command {
    let mut cmd = Command::new(program);
    for (name, _) in std::env::vars() {
        if name.starts_with("ENTREGA_") {
            cmd.env_remove(name);
        }
    }
    let path = std::env::var("PATH").unwrap_or_default();
    cmd.current_dir(dir)
        .env("PATH", format!("{}:{path}", bin.display()))
        .env("ENTREGA_LISTEN", format!("127.0.0.1:{api_port}"))
        .env("ENTREGA_URL", format!("http://127.0.0.1:{api_port}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Terminal 2: one bash that runs each block and marks where its output ends.
struct Shell {
    child: Child,
    stdin: ChildStdin,
    output: Output,
    /// Where the output of the next block starts.
    read: usize,
    blocks_run: usize,
}

impl Shell {
    fn start(mut cmd: Command) -> Self {
        let mut child = cmd.arg("--noprofile").arg("--norc").spawn().unwrap();
        let output = Output::default();
        output.collect(child.stdout.take().unwrap());
        output.collect(child.stderr.take().unwrap());
        let mut stdin = child.stdin.take().unwrap();
        // One stream, in order: the marker after a block must not overtake the block's
        // output through another pipe.
        writeln!(stdin, "exec 2>&1").unwrap();
        Self {
            child,
            stdin,
            output,
            read: 0,
            blocks_run: 0,
        }
    }

    /// Run `script`; its output and exit status.
    fn run(&mut self, script: &str) -> (String, i32) {
        self.blocks_run += 1;
        let marker = format!("@@end-of-block-{}@@", self.blocks_run);
        writeln!(self.stdin, "{script}\nprintf '\\n{marker} %s\\n' $?").unwrap();
        self.stdin.flush().unwrap();
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let text = self.output.text();
            if let Some(at) = text[self.read..].find(&marker) {
                let out = text[self.read..self.read + at].to_owned();
                let rest = &text[self.read + at + marker.len()..];
                let status = rest.split_whitespace().next().and_then(|s| s.parse().ok());
                if let Some(status) = status {
                    self.read += at + marker.len();
                    return (out, status);
                }
            }
            assert!(
                Instant::now() < deadline,
                "this block did not finish:\n{script}\noutput so far:\n{}",
                &text[self.read..]
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Terminals 1 and 3: one long-running command at a time.
struct Background {
    child: Child,
    output: Output,
}

impl Background {
    fn start(mut cmd: Command) -> Self {
        let mut child = cmd.spawn().unwrap();
        let output = Output::default();
        output.collect(child.stdout.take().unwrap());
        output.collect(child.stderr.take().unwrap());
        Self { child, output }
    }

    /// Ctrl-C, as a reader would press it; the command must exit by itself.
    fn interrupt(mut self) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(pid, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "Ctrl-C is a clean exit, not {status}");
                return;
            }
            assert!(Instant::now() < deadline, "Ctrl-C did not stop it");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One expected line as a pattern: runs of spaces match any spacing, `…` anything,
/// and `prefix_…` one id (or key, or secret), captured under its prefix.
fn line_pattern(line: &str) -> (Regex, Vec<String>) {
    let id = Regex::new(r"([a-z]+_)…").unwrap();
    let mut captures = Vec::new();
    let tokens: Vec<String> = line
        .split_whitespace()
        .map(|token| {
            let mut pattern = String::new();
            let mut last = 0;
            for m in id.captures_iter(token) {
                let whole = m.get(0).unwrap();
                pattern.push_str(&wildcards(&token[last..whole.start()]));
                pattern.push_str(&format!("({}{ID_CHARS})", regex_lite::escape(&m[1])));
                captures.push(m[1].to_owned());
                last = whole.end();
            }
            pattern.push_str(&wildcards(&token[last..]));
            pattern
        })
        .collect();
    let indent = if line.starts_with(' ') { r"\s+" } else { "" };
    let pattern = format!(r"^{indent}{}\s*$", tokens.join(r"\s+"));
    (Regex::new(&pattern).unwrap(), captures)
}

/// What an id, key or secret is made of (hex, base64).
const ID_CHARS: &str = "[A-Za-z0-9_+/=-]+";

/// Literal text, with `…` matching anything.
fn wildcards(text: &str) -> String {
    text.split('…')
        .map(regex_lite::escape)
        .collect::<Vec<_>>()
        .join(".*?")
}

/// Whether `actual` has every expected line, in order; the values captured.
fn matches(expected: &str, actual: &str) -> Option<HashMap<String, String>> {
    let mut captured = HashMap::new();
    let mut lines = actual.lines();
    for want in expected.lines().filter(|l| !l.trim().is_empty()) {
        if want.trim() == "…" {
            continue;
        }
        let (pattern, names) = line_pattern(want);
        let found = lines.by_ref().find_map(|l| pattern.captures(l))?;
        for (i, name) in names.iter().enumerate() {
            captured.insert(name.clone(), found[i + 1].to_owned());
        }
    }
    Some(captured)
}

/// A command with every `prefix_…` replaced by the value captured last.
fn substitute(command: &str, captured: &HashMap<String, String>) -> String {
    Regex::new(r"([a-z]+_)…")
        .unwrap()
        .replace_all(command, |m: &regex_lite::Captures| {
            captured
                .get(&m[1])
                .cloned()
                .unwrap_or_else(|| panic!("nothing captured for {} before {command}", &m[0]))
        })
        .into_owned()
}

/// Only reads the delivery log: safe to run again while a delivery settles.
fn is_read_only(script: &str) -> bool {
    script.lines().filter(|l| !l.trim().is_empty()).all(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        words.first() == Some(&"entrega") && words.iter().any(|w| *w == "list" || *w == "show")
    })
}

/// Wait until `output` (or each new run of `rerun`) shows `expected`.
fn await_output(
    expected: &str,
    mut current: impl FnMut() -> String,
    what: &str,
) -> HashMap<String, String> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        let text = current();
        if let Some(captured) = matches(expected, &text) {
            return captured;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never showed\n{expected}\n--- it printed ---\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_readme_walkthrough_runs_as_written() {
    assert!(
        Command::new("jq").arg("--version").output().is_ok(),
        "the walkthrough uses jq (and curl): install them"
    );
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let (api_port, receiver_port) = (free_port(), free_port());
    let readme = readme
        .replace(README_API_PORT, &api_port.to_string())
        .replace(README_RECEIVER_PORT, &receiver_port.to_string());
    let blocks = blocks(&readme);
    assert!(blocks.len() > 10, "the walkthrough was found: {blocks:?}");

    let dir = TempDir::new("readme");
    let bin = dir.0.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(entrega_bin(), bin.join("entrega")).unwrap();
    let work = dir.0.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let terminal = |program: &str| command(program, &work, &bin, api_port);

    let mut shell = Shell::start(terminal("bash"));
    let mut background: HashMap<u8, Background> = HashMap::new();
    let mut captured: HashMap<String, String> = HashMap::new();
    // The last terminal-2 block, its output, and whether it may be run again.
    let mut last_run: Option<(String, String)> = None;
    for block in &blocks {
        match (block.lang.as_str(), block.terminal) {
            ("sh", 2) => {
                let script = substitute(&block.body, &captured);
                let (out, status) = shell.run(&script);
                assert_eq!(status, 0, "{script}\nfailed:\n{out}");
                last_run = Some((script, out));
            }
            ("sh", n) => {
                if let Some(running) = background.remove(&n) {
                    running.interrupt();
                }
                let command_line = substitute(&block.body, &captured);
                let mut cmd = terminal("bash");
                cmd.arg("-c").arg(format!("exec {command_line}"));
                background.insert(n, Background::start(cmd));
                last_run = None;
            }
            ("text", 2) => {
                let (script, out) = last_run.take().expect("output follows a command");
                let found = if is_read_only(&script) {
                    let mut first = Some(out);
                    await_output(
                        &block.body,
                        || {
                            first.take().unwrap_or_else(|| {
                                let (out, status) = shell.run(&script);
                                assert_eq!(status, 0, "{script}\nfailed:\n{out}");
                                out
                            })
                        },
                        &script,
                    )
                } else {
                    matches(&block.body, &out).unwrap_or_else(|| {
                        panic!("{script}\nprinted\n{out}\n--- not ---\n{}", block.body)
                    })
                };
                captured.extend(found);
            }
            ("text", n) => {
                let output = background
                    .get(&n)
                    .unwrap_or_else(|| panic!("terminal {n} runs nothing"))
                    .output
                    .clone();
                let found = await_output(&block.body, || output.text(), &format!("terminal {n}"));
                captured.extend(found);
            }
            (lang, _) => panic!("a {lang} block in the walkthrough"),
        }
    }
    for (_, running) in background.drain() {
        running.interrupt();
    }
    assert!(
        captured.contains_key("fail_"),
        "the walkthrough got as far as the failure: {captured:?}"
    );
}

#[test]
fn expected_lines_match_with_wildcards_and_capture_ids() {
    let got = matches(
        "ID     STATUS\ndlv_…  delivered  …\n   → answered 200",
        "noise\nID  STATUS\ndlv_01ab  delivered  2026\nmore\n   → answered 200\n",
    )
    .unwrap();
    assert_eq!(got["dlv_"], "dlv_01ab");
    assert!(matches("dlv_…  failed", "dlv_01ab  delivered").is_none());
    assert!(
        matches("b\na", "a\nb").is_none(),
        "lines must come in order"
    );
    assert_eq!(
        substitute("entrega resend dlv_…", &got),
        "entrega resend dlv_01ab"
    );
    assert!(is_read_only(
        "entrega deliveries list --status exhausted\nentrega failures list"
    ));
    assert!(!is_read_only("entrega resend dlv_1"));
}
