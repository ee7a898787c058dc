//! Secrets never leak: every command, and every error path, run with distinctive secrets in
//! the database and sink URLs, and none of their output (stdout, stderr, debug logs) holds
//! them. The local PostgreSQL trusts loopback and ignores the password; the local NATS has no
//! auth and ignores the token, so the happy paths really run with secret-bearing URLs.

#![allow(clippy::unwrap_used)]

use crate::common;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The password in the database URL.
const PG_SECRET: &str = "PgPa55wordQ7";
/// A NATS token (lone userinfo).
const NATS_TOKEN: &str = "NatsT0kenZ3";
/// A NATS password (user:password userinfo).
const NATS_PASSWORD: &str = "NatsPa55Y8";
/// A secret in a query parameter.
const QUERY_SECRET: &str = "QuerySecretW4";
/// The tail of a password with an unencoded `/` and `@`.
const SLASH_TAIL: &str = "Tai1AfterSlashV6";
/// A password read from a file (`password_file=`).
const FILE_SECRET: &str = "FilePa55wordK2";
/// A password read from the environment (`password_env=`).
const ENV_SECRET: &str = "EnvPa55wordJ9";

const ALL: &[&str] = &[
    PG_SECRET,
    NATS_TOKEN,
    NATS_PASSWORD,
    QUERY_SECRET,
    SLASH_TAIL,
    FILE_SECRET,
    ENV_SECRET,
];

/// The test database, reached with a password the server ignores.
fn pg_url() -> String {
    let base = common::database_url();
    let rest = base
        .strip_prefix("postgres://")
        .expect("a postgres:// test URL");
    let (user, host) = rest.split_once('@').expect("a user in the test URL");
    let user = user.split(':').next().unwrap_or(user);
    format!("postgres://{user}:{PG_SECRET}@{host}")
}

/// The test NATS, reached with a token the server ignores.
fn nats_token_url() -> String {
    common::nats_url().replacen("nats://", &format!("nats://{NATS_TOKEN}@"), 1)
}

/// Nothing listens on port 1.
const CLOSED: &str = "127.0.0.1:1";

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(outbox_testkit::unique_name(tag));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The `outbox` binary with the most verbose logs, so a secret in any log line shows up.
fn outbox(cwd: &Path) -> Command {
    let mut c = common::outbox_command(cwd);
    c.env("OUTBOX_LOG", "debug");
    c
}

/// Asserts that no secret appears in `o`'s output; returns the output as text.
fn assert_clean(what: &str, stdout: &[u8], stderr: &[u8]) -> String {
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(stdout),
        String::from_utf8_lossy(stderr)
    );
    for secret in ALL {
        assert!(
            !text.contains(secret),
            "{what}: the output holds the secret {secret}:\n{text}"
        );
    }
    text
}

fn run_clean(what: &str, c: &mut Command) -> (Output, String) {
    let o = c.stdin(Stdio::null()).output().unwrap();
    let text = assert_clean(what, &o.stdout, &o.stderr);
    (o, text)
}

/// Output of a long-lived command goes to files, not pipes: a debug log can fill a pipe no one
/// reads and block the process.
fn spawn_logged(c: &mut Command) -> (Child, PathBuf, PathBuf) {
    let dir = tmp("sec-out");
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let child = c
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    (child, out, err)
}

/// Checks the output `spawn_logged` collected, then removes it.
fn logged_clean(what: &str, out: &Path, err: &Path) -> String {
    let text = assert_clean(
        what,
        &std::fs::read(out).unwrap(),
        &std::fs::read(err).unwrap(),
    );
    if let Some(dir) = out.parent() {
        std::fs::remove_dir_all(dir).ok();
    }
    text
}

/// Runs a long-lived command for `d`, stops it with SIGTERM and checks its output.
fn run_briefly(what: &str, c: &mut Command, d: Duration) -> String {
    let (mut child, out, err) = spawn_logged(c);
    std::thread::sleep(d);
    common::sigterm(&child);
    common::wait_exit(&mut child, Duration::from_secs(20));
    logged_clean(what, &out, &err)
}

/// A migrated schema of its own, dropped at the end.
struct Schema(String);

impl Schema {
    fn new(cwd: &Path) -> Self {
        let name = outbox_testkit::unique_name("sec");
        let (o, text) = run_clean(
            "migrate",
            outbox(cwd).args(["migrate", "--database-url", &pg_url(), "--schema", &name]),
        );
        assert!(o.status.success(), "{text}");
        Self(name)
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([
                &common::database_url(),
                "-qc",
                &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.0),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

#[test]
fn relay_print_config_status_and_migrate_never_show_secrets() {
    let cwd = tmp("sec-relay");
    let schema = Schema::new(&cwd);
    let sinks = [
        nats_token_url(),
        format!("nats://app:{NATS_PASSWORD}@127.0.0.1:4222"),
    ];
    for sink in &sinks {
        let (o, text) = run_clean(
            "relay --print-config",
            outbox(&cwd).args([
                "relay",
                "--print-config",
                "--database-url",
                &pg_url(),
                "--schema",
                &schema.0,
                "--sink",
                sink,
            ]),
        );
        assert!(o.status.success(), "{text}");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(
            v["sink"].as_str().unwrap().contains("***@127.0.0.1:4222"),
            "{v}"
        );
        assert!(v["database_url"].as_str().unwrap().contains("***@"), "{v}");
        // The same settings from the environment and the file.
        std::fs::write(
            cwd.join("outbox.toml"),
            format!(
                "database_url = \"{}\"\n[relay]\nsink = \"{sink}\"\n",
                pg_url()
            ),
        )
        .unwrap();
        let (o, text) = run_clean(
            "relay --print-config from the file",
            outbox(&cwd).args(["relay", "--print-config", "--schema", &schema.0]),
        );
        assert!(o.status.success(), "{text}");
        std::fs::remove_file(cwd.join("outbox.toml")).unwrap();
    }
    // A relay that runs for a while: start-up log, connection events, polls, shutdown.
    let text = run_briefly(
        "relay",
        outbox(&cwd).args([
            "relay",
            "--database-url",
            &pg_url(),
            "--schema",
            &schema.0,
            "--sink",
            &nats_token_url(),
            "--lease",
            "15s",
        ]),
        Duration::from_secs(3),
    );
    assert!(text.contains("relay configured"), "{text}");
    // The same through the environment, as a container would pass it.
    run_briefly(
        "relay from the environment",
        outbox(&cwd)
            .args(["relay", "--schema", &schema.0])
            .env("OUTBOX_DATABASE_URL", pg_url())
            .env("OUTBOX_SINK", nats_token_url()),
        Duration::from_secs(2),
    );
    for format in ["text", "json"] {
        let (o, text) = run_clean(
            "status",
            outbox(&cwd).args([
                "status",
                "--database-url",
                &pg_url(),
                "--schema",
                &schema.0,
                "--format",
                format,
            ]),
        );
        assert!(o.status.success(), "{text}");
    }
    let (o, text) = run_clean(
        "migrate --notify",
        outbox(&cwd).args([
            "migrate",
            "--notify",
            "--database-url",
            &pg_url(),
            "--schema",
            &schema.0,
        ]),
    );
    assert!(o.status.success(), "{text}");
    std::fs::remove_dir_all(&cwd).ok();
}

#[test]
fn error_paths_never_show_secrets() {
    let cwd = tmp("sec-errors");
    let schema = Schema::new(&cwd);
    let dead_db = format!("postgres://root:{PG_SECRET}@{CLOSED}/test");
    let slash_db = format!(
        "postgres://root:a/b@{SLASH_TAIL}@{}",
        common::database_url().rsplit_once('@').unwrap().1
    );
    let dead_sink = format!("nats://{NATS_TOKEN}@{CLOSED}");
    // Commands that must fail, each with a message that says what failed.
    let failing: Vec<(&str, Vec<String>)> = vec![
        (
            "status, database unreachable",
            vec!["status".into(), "--database-url".into(), dead_db.clone()],
        ),
        (
            "migrate, database unreachable",
            vec!["migrate".into(), "--database-url".into(), dead_db.clone()],
        ),
        (
            "relay, database unreachable",
            vec![
                "relay".into(),
                "--database-url".into(),
                dead_db.clone(),
                "--sink".into(),
                nats_token_url(),
            ],
        ),
        (
            "status, password with an unencoded / and @",
            vec!["status".into(), "--database-url".into(), slash_db.clone()],
        ),
        (
            "relay, unknown sink scheme",
            vec![
                "relay".into(),
                "--database-url".into(),
                pg_url(),
                "--schema".into(),
                schema.0.clone(),
                "--sink".into(),
                format!("kafkaa://user:{NATS_PASSWORD}@{CLOSED}"),
            ],
        ),
        (
            "relay, unknown sink option holding a secret",
            vec![
                "relay".into(),
                "--database-url".into(),
                pg_url(),
                "--schema".into(),
                schema.0.clone(),
                "--sink".into(),
                format!("nats://127.0.0.1:4222?token={QUERY_SECRET}"),
            ],
        ),
        (
            "demo, database unreachable",
            vec![
                "demo".into(),
                "--database-url".into(),
                dead_db.clone(),
                "--dir".into(),
                cwd.join("demo").display().to_string(),
            ],
        ),
        (
            "demo, broker unreachable",
            vec![
                "demo".into(),
                "--sink".into(),
                dead_sink.clone(),
                "--dir".into(),
                cwd.join("demo").display().to_string(),
            ],
        ),
        (
            "verify, database unreachable",
            vec![
                "verify".into(),
                "--database-url".into(),
                dead_db.clone(),
                "--sink".into(),
                nats_token_url(),
                "--duration".into(),
                "1s".into(),
            ],
        ),
        (
            "bench, database unreachable",
            vec![
                "bench".into(),
                "--database-url".into(),
                dead_db.clone(),
                "--sink".into(),
                nats_token_url(),
                "--rows".into(),
                "10".into(),
            ],
        ),
        (
            "bench, broker unreachable",
            vec![
                "bench".into(),
                "--database-url".into(),
                pg_url(),
                "--sink".into(),
                dead_sink.clone(),
                "--rows".into(),
                "10".into(),
            ],
        ),
    ];
    // All at once: most wait out a connection timeout.
    let started = Instant::now();
    let running: Vec<_> = failing
        .iter()
        .map(|(what, args)| (what, spawn_logged(outbox(&cwd).args(args))))
        .collect();
    for (what, (mut child, out, err)) in running {
        // A command that retries an unreachable service forever is stopped after a while:
        // its retry logs are output too.
        let limit = Duration::from_secs(30).saturating_sub(started.elapsed());
        let status = wait_or_stop(&mut child, limit);
        let text = logged_clean(what, &out, &err);
        assert!(
            status.is_some_and(|s| !s.success()),
            "{what}: expected a failure, got {status:?}:\n{text}"
        );
        assert!(
            text.contains("error: "),
            "{what}: it does not say what failed:\n{text}"
        );
    }
    // A relay whose broker is unreachable keeps running and reports the outage: its log lines
    // hold no secret either.
    run_briefly(
        "relay, broker unreachable",
        outbox(&cwd).args([
            "relay",
            "--database-url",
            &pg_url(),
            "--schema",
            &schema.0,
            "--sink",
            &dead_sink,
        ]),
        Duration::from_secs(3),
    );
    std::fs::remove_dir_all(&cwd).ok();
}

/// Waits for `child` up to `limit`, then sends SIGTERM (and SIGKILL if that does not end it).
fn wait_or_stop(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    common::sigterm(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    None
}

#[test]
fn demo_never_shows_secrets() {
    let cwd = tmp("sec-demo");
    let schema = format!("outbox_demo_{}", outbox_testkit::unique_name("s"));
    let (o, text) = run_clean(
        "demo",
        outbox(&cwd).args([
            "demo",
            "--database-url",
            &pg_url(),
            "--schema",
            &schema,
            "--sink",
            &nats_token_url(),
            "--dir",
            &cwd.join("demo").display().to_string(),
            "--outage-seconds",
            "1",
            "--lease",
            "1s",
        ]),
    );
    drop(Schema(schema));
    assert!(o.status.success(), "{text}");
    std::fs::remove_dir_all(&cwd).ok();
}

#[test]
fn bench_never_shows_secrets() {
    let cwd = tmp("sec-bench");
    let (o, text) = run_clean(
        "bench",
        outbox(&cwd).args([
            "bench",
            "--database-url",
            &pg_url(),
            "--sink",
            &nats_token_url(),
            "--rows",
            "300",
            "--naive-rows",
            "50",
            "--keys",
            "10",
            "--storage",
            "memory",
        ]),
    );
    // It ran the relay with these URLs to the end and printed no secret (`run_clean`).
    assert!(o.status.success(), "{text}");
    assert!(text.contains("filled in"), "{text}");
    std::fs::remove_dir_all(&cwd).ok();
}

/// The command line of every live process whose parent is `pid`.
fn children_cmdlines(pid: u32) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid …: comm may hold spaces, so read after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
                out.push(String::from_utf8_lossy(&cmd).replace('\0', " "));
            }
        }
    }
    out
}

#[test]
fn verify_keeps_secrets_off_its_relays_command_lines_and_out_of_its_report() {
    let cwd = tmp("sec-verify");
    // verify itself takes both URLs from the environment, so no secret is on any command line.
    let mut child = outbox(&cwd)
        .args([
            "verify",
            "--duration",
            "3s",
            "--relays",
            "2",
            "--producers",
            "2",
            "--keys",
            "8",
            "--faults",
            "kill",
            "--fault-interval",
            "1s",
            "--lease",
            "2s",
        ])
        .env("OUTBOX_DATABASE_URL", pg_url())
        .env("OUTBOX_SINK", nats_token_url())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its report, read as it comes: the second line names the folder of the relays' logs.
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut s = String::new();
        let _ = std::io::BufReader::new(stdout).read_to_string(&mut s);
        s
    });
    let stderr = child.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut s = String::new();
        let _ = std::io::BufReader::new(stderr).read_to_string(&mut s);
        s
    });
    let mut seen = Vec::new();
    let mut logs = String::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "verify did not finish");
        for cmd in children_cmdlines(child.id()) {
            if cmd.contains(" relay") && !seen.contains(&cmd) {
                seen.push(cmd);
            }
        }
        // The relays' own logs, while they exist (verify removes its folder at the end).
        for dir in verify_dirs() {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if e.file_name().to_string_lossy().ends_with(".log") {
                    logs.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = child.wait().unwrap();
    let (out, err) = (reader.join().unwrap(), err_reader.join().unwrap());
    let text = assert_clean("verify", out.as_bytes(), err.as_bytes());
    assert!(status.success(), "{text}");
    assert_clean("verify's relay logs", logs.as_bytes(), b"");
    assert!(!seen.is_empty(), "no relay process was seen");
    for cmd in &seen {
        for secret in ALL {
            assert!(!cmd.contains(secret), "a relay's command line: {cmd}");
        }
        assert!(
            !cmd.contains("nats://"),
            "the sink URL is on a command line: {cmd}"
        );
        assert!(
            !cmd.contains("postgres://"),
            "the database URL is on a command line: {cmd}"
        );
    }
    std::fs::remove_dir_all(&cwd).ok();
}

/// Folders of `outbox verify` runs (any run's: other runs' logs hold none of these secrets).
fn verify_dirs() -> Vec<PathBuf> {
    std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("outbox-verify-")
        })
        .map(|e| e.path())
        .collect()
}

#[test]
fn inbox_commands_never_show_secrets() {
    let cwd = tmp("sec-inbox");
    let schema = Schema::new(&cwd);
    let (o, text) = run_clean(
        "migrate --inbox",
        outbox(&cwd).args([
            "migrate",
            "--inbox",
            "--database-url",
            &pg_url(),
            "--schema",
            &schema.0,
        ]),
    );
    assert!(o.status.success(), "{text}");
    let source = format!(
        "{}?stream=NO_SUCH_STREAM_{}",
        nats_token_url(),
        schema.0.to_uppercase()
    );
    let (o, text) = run_clean(
        "inbox --print-config",
        outbox(&cwd)
            .args([
                "inbox",
                "--print-config",
                "--database-url",
                &pg_url(),
                "--schema",
                &schema.0,
            ])
            .env("OUTBOX_INBOX_SOURCE", &source),
    );
    assert!(o.status.success() && text.contains("***"), "{text}");
    for (what, args) in [
        ("status --inbox", vec!["status", "--inbox"]),
        ("failed --inbox", vec!["failed", "--inbox"]),
        ("redrive --inbox --all", vec!["redrive", "--inbox", "--all"]),
    ] {
        let (o, text) = run_clean(
            what,
            outbox(&cwd)
                .args(&args)
                .args(["--database-url", &pg_url(), "--schema", &schema.0]),
        );
        assert!(o.status.success(), "{what}: {text}");
    }
    // Error paths: a stream that does not exist, brokers that do not answer, no inbox tables.
    let dead_nats = format!("nats://{NATS_TOKEN}@{CLOSED}?stream=S");
    let dead_redis = format!("redis://:{NATS_PASSWORD}@{CLOSED}?stream=s");
    for (what, db_schema, src) in [
        ("inbox, missing stream", schema.0.as_str(), source.as_str()),
        (
            "inbox, NATS unreachable",
            schema.0.as_str(),
            dead_nats.as_str(),
        ),
        (
            "inbox, Redis unreachable",
            schema.0.as_str(),
            dead_redis.as_str(),
        ),
        (
            "inbox, no inbox tables",
            "public_no_inbox_here",
            source.as_str(),
        ),
    ] {
        let mut c = outbox(&cwd);
        c.args(["inbox", "--database-url", &pg_url(), "--schema", db_schema])
            .env("OUTBOX_INBOX_SOURCE", src);
        let (mut child, out, err) = spawn_logged(&mut c);
        let status = wait_or_stop(&mut child, Duration::from_secs(40));
        let text = logged_clean(what, &out, &err);
        assert!(
            status.is_some_and(|s| !s.success()),
            "{what}: expected a failure:\n{text}"
        );
    }
    let _ = Command::new("psql")
        .args([
            &common::database_url(),
            "-qc",
            &format!("DROP SCHEMA IF EXISTS {}_inbox CASCADE", schema.0),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    std::fs::remove_dir_all(&cwd).ok();
}

fn tls_dir() -> String {
    std::env::var("OUTBOX_TLS_DIR").unwrap_or_else(|_| "/var/tmp/outbox-tls".into())
}

/// The body of the test client key (scripts/tls-certs.sh): no output may hold any of it.
fn client_key_lines() -> Vec<String> {
    std::fs::read_to_string(format!("{}/client.key", tls_dir()))
        .expect("scripts/tls-certs.sh made the test certificates")
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() > 16)
        .map(str::to_string)
        .collect()
}

/// Secrets from files and the environment, and TLS keys, stay out of `--print-config`, the
/// logs and the errors of relays whose broker refuses their login (the TLS listeners
/// scripts/services.sh starts: Redis with ACL users on 6380, NATS with users on 4223).
#[test]
fn secrets_from_files_and_the_environment_and_tls_keys_never_show() {
    let cwd = tmp("sec-tls");
    let schema = Schema::new(&cwd);
    let d = tls_dir();
    let pass_file = cwd.join("password");
    std::fs::write(&pass_file, format!("{FILE_SECRET}\n")).unwrap();
    let tls = format!("tls_ca={d}/ca.pem&tls_cert={d}/client.pem&tls_key={d}/client.key");
    let key_lines = client_key_lines();
    let sinks = [
        format!(
            "rediss://relay@localhost:6380?{tls}&password_file={}",
            pass_file.display()
        ),
        format!("nats://relay@localhost:4223?{tls}&password_env=OUTBOX_SEC_TEST_PASSWORD"),
        format!(
            "mqtts://relay@localhost:8883?{tls}&password_file={}",
            pass_file.display()
        ),
    ];
    for sink in &sinks {
        let (o, text) = run_clean(
            "relay --print-config with secrets from a file and the environment",
            outbox(&cwd)
                .args([
                    "relay",
                    "--print-config",
                    "--database-url",
                    &pg_url(),
                    "--schema",
                    &schema.0,
                    "--sink",
                    sink,
                ])
                .env("OUTBOX_SEC_TEST_PASSWORD", ENV_SECRET),
        );
        assert!(o.status.success(), "{text}");
        for line in &key_lines {
            assert!(
                !text.contains(line.as_str()),
                "the client key shows:\n{text}"
            );
        }
        // A relay whose broker refuses the password (the file's and the variable's are wrong
        // for these servers), with debug logs: the error names the server and the cause only.
        let text = run_briefly(
            "relay with a refused login",
            outbox(&cwd)
                .args([
                    "relay",
                    "--database-url",
                    &pg_url(),
                    "--schema",
                    &schema.0,
                    "--sink",
                    sink,
                    "--lease",
                    "15s",
                ])
                .env("OUTBOX_SEC_TEST_PASSWORD", ENV_SECRET),
            Duration::from_secs(3),
        );
        for line in &key_lines {
            assert!(
                !text.contains(line.as_str()),
                "the client key shows:\n{text}"
            );
        }
    }
    std::fs::remove_dir_all(&cwd).ok();
}
