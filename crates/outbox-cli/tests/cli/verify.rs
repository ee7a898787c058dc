//! `outbox verify` as CI runs it, shortened: a passed run removes everything it made on the
//! server, its least-privilege logins included (they are cluster-wide: a leaked one outlives
//! the run's schema and piles up run after run).

use std::process::Command;
use std::time::Duration;

use sqlx::PgPool;

use crate::common;

/// The run's report (`--format json`) and its stderr, after asserting it exited 0.
fn verify(mode: &str) -> (serde_json::Value, String) {
    let cwd = std::env::temp_dir().join(outbox_testkit::unique_name("verify"));
    std::fs::create_dir_all(&cwd).unwrap();
    let out = run_bounded(common::outbox_command(&cwd).args([
        "verify",
        "--mode",
        mode,
        "--duration",
        "9s",
        "--relays",
        "2",
        "--faults",
        "kill",
        "--fault-interval",
        "2s",
        "--format",
        "json",
        "--database-url",
        &common::database_url(),
        "--sink",
        &common::nats_url(),
    ]));
    std::fs::remove_dir_all(&cwd).ok();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "verify --mode {mode} failed: {stderr}"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("verify's report is not JSON ({e}): {stderr}"));
    (report, stderr)
}

/// Runs `c` to its end, killing it after three minutes (a hung run fails, it does not hang).
fn run_bounded(c: &mut Command) -> std::process::Output {
    let child = c
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(180)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("verify did not finish within three minutes");
        }
    }
}

/// The run's schema, out of the report's `database` (schema `outbox_verify_…`).
fn schema_of(report: &serde_json::Value) -> String {
    let place = report["database"].as_str().unwrap();
    place
        .split('`')
        .nth(1)
        .unwrap_or_else(|| panic!("no schema in {place}"))
        .to_string()
}

/// The roles, replication slots and publications named after `schema` still on the server.
async fn left_behind(pool: &PgPool, schema: &str) -> Vec<String> {
    let sql = "SELECT 'role ' || rolname FROM pg_roles WHERE starts_with(rolname, $1) \
               UNION ALL SELECT 'slot ' || slot_name FROM pg_replication_slots \
                         WHERE strpos(slot_name, $1) > 0 \
               UNION ALL SELECT 'publication ' || pubname FROM pg_publication \
                         WHERE strpos(pubname, $1) > 0 \
               UNION ALL SELECT 'schema ' || nspname FROM pg_namespace WHERE nspname = $1";
    sqlx::query_scalar(sql)
        .bind(schema)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// A passed `--mode switch` run (the slot made under load, by `outbox migrate --cdc`) drops
/// its logins, owner included, and its slot and publication. The owner's login used to stay:
/// the switch made the slot as the administrator, whose `outbox_emit` in the owner's schema
/// kept `DROP OWNED BY` from dropping the schema, and the run still passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switching_run_leaves_no_login_slot_or_publication_behind() {
    let pool = outbox_postgres::connect_pool(&common::database_url(), 2)
        .await
        .expect("PostgreSQL must be running");
    let (report, stderr) = tokio::task::spawn_blocking(|| verify("switch"))
        .await
        .unwrap();
    assert_eq!(report["ok"], true, "{report}\n{stderr}");
    assert_eq!(report["faults_injected"]["switch"], 1, "{report}");
    let schema = schema_of(&report);
    assert!(
        !stderr.contains("not dropped"),
        "verify could not drop a login: {stderr}"
    );
    assert_eq!(
        left_behind(&pool, &schema).await,
        Vec::<String>::new(),
        "{stderr}"
    );
}
