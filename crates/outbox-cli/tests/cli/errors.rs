//! The first errors a user meets, read as a newcomer reads them: each says its cause once, with
//! what to do, and a mistake that needs no network is reported before anything connects. Each
//! test asserts the exact text `outbox` prints.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

/// `outbox` with `args`, none of the user's `OUTBOX_*` or `DATABASE_URL` settings, and only
/// errors logged.
fn outbox(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox"));
    for (name, _) in std::env::vars() {
        if name.starts_with("OUTBOX_") || name == "DATABASE_URL" {
            cmd.env_remove(name);
        }
    }
    cmd.env("OUTBOX_LOG", "off")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// What `outbox` wrote on stderr, when it failed.
fn error_of(o: &Output) -> String {
    assert!(!o.status.success(), "it succeeded: {o:?}");
    String::from_utf8_lossy(&o.stderr).trim_end().to_string()
}

fn database_url() -> String {
    std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into())
}

#[test]
fn a_database_server_that_cannot_be_reached_is_named_with_its_cause() {
    let o = outbox(&[
        "status",
        "--database-url",
        "postgres://app:hunter2@127.0.0.1:1/x",
    ]);
    assert_eq!(
        error_of(&o),
        "error: cannot reach PostgreSQL at 127.0.0.1:1: connection refused (is the server \
         running?)"
    );
}

#[test]
fn a_database_that_does_not_exist_is_said_once() {
    let name = outbox_testkit::unique_name("nodb");
    let url = database_url();
    let base = url.rsplit_once('/').unwrap().0;
    let o = outbox(&["status", "--database-url", &format!("{base}/{name}")]);
    assert_eq!(
        error_of(&o),
        format!("error: database \"{name}\" does not exist")
    );
    assert_eq!(o.status.code(), Some(2), "a configuration problem");
}

#[test]
fn a_schema_never_migrated_says_what_to_run() {
    let schema = outbox_testkit::unique_name("never");
    for command in ["status", "failed", "maintain"] {
        let o = outbox(&[
            command,
            "--database-url",
            &database_url(),
            "--schema",
            &schema,
        ]);
        assert_eq!(
            error_of(&o),
            format!(
                "error: schema \"{schema}\" has no outbox tables: run outbox migrate --schema \
                 {schema}"
            ),
            "outbox {command}"
        );
    }
}

#[test]
fn an_sqlite_file_without_tables_says_what_to_run() {
    let dir = std::env::temp_dir().join(outbox_testkit::unique_name("errors"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("empty.db");
    let o = outbox(&[
        "status",
        "--database-url",
        &format!("sqlite://{}", file.display()),
    ]);
    assert_eq!(
        error_of(&o),
        format!(
            "error: database file {p} has no outbox tables: run outbox migrate --database-url \
             sqlite://{p}",
            p = file.display()
        )
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_misspelt_sink_is_reported_before_an_unreachable_database() {
    let o = outbox(&[
        "relay",
        "--database-url",
        "postgres://127.0.0.1:1/x",
        "--sink",
        "nast://127.0.0.1:4222",
    ]);
    let e = error_of(&o);
    assert!(
        e.starts_with(
            "error: sink `nast://127.0.0.1:4222`: unknown or disabled sink scheme `nast`; this \
             build supports: nats://"
        ),
        "{e}"
    );
    assert_eq!(o.status.code(), Some(2), "a configuration problem");
}

#[test]
fn a_misspelt_source_is_reported_before_an_unreachable_database() {
    let o = outbox(&[
        "inbox",
        "--database-url",
        "postgres://127.0.0.1:1/x",
        "--source",
        "nats://127.0.0.1:4222?stream=S&ack_wiat=5s",
    ]);
    let e = error_of(&o);
    assert!(
        e.starts_with("error: source option `ack_wiat` is not known for nats:// (known: "),
        "{e}"
    );
    assert_eq!(o.status.code(), Some(2), "a configuration problem");
}

#[test]
fn a_bad_sink_option_names_the_option_and_what_is_expected() {
    let o = outbox(&[
        "relay",
        "--database-url",
        "postgres://127.0.0.1:1/x",
        "--sink",
        "redis://127.0.0.1:6379?ack_timeout=2d",
    ]);
    assert_eq!(
        error_of(&o),
        "error: sink option ack_timeout=`2d`: expected at most 1day"
    );
}
