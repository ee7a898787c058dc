//! `outbox migrate`, `outbox migrate --binlog` and `outbox status`, the binary itself, run by an
//! operator account holding exactly the grants docs/engine-mysql.md lists for it ("Least
//! privileges"), on this machine's MariaDB (no binlog) and the one with the row binlog
//! (127.0.0.1:3307, where `CREATE TRIGGER` also needs the `SUPER` line). The account and the
//! database are made for the test and dropped after.

#![allow(clippy::unwrap_used)] // tests

use std::process::Command;

use sqlx::mysql::MySqlPoolOptions;

/// The operator's grants as the docs' table writes them, `{db}` and `{user}` filled in.
const OPERATOR: &str = "GRANT CREATE, ALTER, DROP, INDEX, TRIGGER, CREATE VIEW, SELECT, INSERT, \
                        UPDATE, DELETE ON {db}.* TO {user}";
/// For `--binlog`.
const OPERATOR_BINLOG: &str = "GRANT BINLOG MONITOR ON *.* TO {user}";
/// Where the server writes a binlog and does not trust function creators.
const OPERATOR_BINLOG_ON: &str = "GRANT SUPER ON *.* TO {user}";

fn server(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.into())
}

/// `outbox <args>` as `url`'s user; its standard output, or a panic with what it said.
fn outbox(url: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(args)
        .env("OUTBOX_DATABASE_URL", url)
        .env_remove("DATABASE_URL")
        .env("OUTBOX_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "outbox {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The operator on `url`'s server migrates a database that does not exist yet (and with
/// `binlog`, turns the binlog route on), twice, and reads `outbox status`.
async fn operator_runs_migrate(url: &str, binlog: bool) {
    let root = MySqlPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("MariaDB at {url} must be running (scripts/services.sh): {e}"));
    let (log_bin, trusted): (i64, i64) = sqlx::query_as(
        "SELECT CAST(@@log_bin AS SIGNED), CAST(@@log_bin_trust_function_creators AS SIGNED)",
    )
    .fetch_one(&root)
    .await
    .unwrap();
    let db = outbox_testkit::unique_name("outbox_op");
    let name = format!("op_{:08x}", fastrand::u32(..));
    let user = format!("'{name}'@'127.0.0.1'");
    sqlx::raw_sql(&format!("CREATE USER {user} IDENTIFIED BY 'pw-test-only'"))
        .execute(&root)
        .await
        .unwrap();
    let mut grants = vec![OPERATOR];
    if binlog {
        grants.push(OPERATOR_BINLOG);
    }
    if log_bin == 1 && trusted == 0 {
        grants.push(OPERATOR_BINLOG_ON);
    }
    for g in grants {
        let sql = g.replace("{db}", &db).replace("{user}", &user);
        sqlx::raw_sql(&sql).execute(&root).await.unwrap();
    }
    let host = url.split_once('@').unwrap().1.split('/').next().unwrap();
    let as_operator = format!("mysql://{name}:pw-test-only@{host}/");
    let mut args = vec!["migrate", "--schema", db.as_str()];
    if binlog {
        args.push("--binlog");
    }
    let first = outbox(&as_operator, &args);
    assert!(first.contains("applied migrations [1, 2, 3, 4]"), "{first}");
    if binlog {
        assert!(first.contains("binlog route on"), "{first}");
    }
    let again = outbox(&as_operator, &args);
    assert!(again.contains("is up to date"), "{again}");
    let status = outbox(
        &format!("mysql://{name}:pw-test-only@{host}/{db}"),
        &["status", "--schema", &db, "--format", "json"],
    );
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["pending"], 0, "{status}");
    sqlx::raw_sql(&format!("DROP DATABASE `{db}`"))
        .execute(&root)
        .await
        .unwrap();
    sqlx::raw_sql(&format!("DROP USER {user}"))
        .execute(&root)
        .await
        .unwrap();
}

#[tokio::test]
async fn outbox_migrate_runs_as_the_operator_with_exactly_the_documented_grants() {
    operator_runs_migrate(
        &server("OUTBOX_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"),
        false,
    )
    .await;
}

#[tokio::test]
async fn outbox_migrate_binlog_runs_as_the_operator_with_exactly_the_documented_grants() {
    operator_runs_migrate(
        &server(
            "OUTBOX_TEST_MYSQL_BINLOG_URL",
            "mysql://root@127.0.0.1:3307/test",
        ),
        true,
    )
    .await;
}
