//! The last phase of a run: a failed run keeps its evidence and says where it is (the relays'
//! logs, what the store knows of the lost messages); a passed one removes what it made (the
//! inbox's queue, the CDC slot, the logins, the schema, the destination, the directory).

use std::time::Duration;

use outbox_db::{Backend, Database};

use super::prepare::Setup;
use super::start::Processes;
use super::{bounded, progress, Settings, PHASE_LIMIT};
use crate::report::Report;

/// Keeps a failed run's evidence, or (unless `--keep`) cleans a passed run up.
pub(super) async fn teardown(
    settings: &Settings,
    mut setup: Setup,
    processes: Processes,
    report: &Report,
) {
    progress(processes.started, "checked; cleaning up");
    // A failed run keeps its evidence: what the relays logged and what the database holds
    // are what explains a lost message, and nothing else would.
    let failed = !report.ok;
    if failed {
        eprintln!(
            "verify: the run failed; the {} and the relay logs in {} are kept for inspection \
             (remove them by hand)",
            report.database,
            setup.tmp.display()
        );
        print_log_tails(&setup.tmp);
        explain_lost(&setup, report).await;
    }
    if !settings.keep && !failed {
        clean_up(settings, &mut setup, processes).await;
    }
}

/// Whether the store recorded a lost message as acknowledged tells a broker (or reader) that
/// dropped it from a relay that never published it: printed for a few lost messages.
async fn explain_lost(setup: &Setup, report: &Report) {
    for id in report.lost_sample.iter().take(LOST_EXPLAINED) {
        let Ok(uuid) = id.parse::<uuid::Uuid>() else {
            continue;
        };
        match bounded(setup.store.journey(&outbox_core::JourneyQuery::Id(uuid), 1)).await {
            Ok(journeys) => match journeys.first() {
                Some(j) => {
                    let steps: Vec<String> = j
                        .steps
                        .iter()
                        .map(|s| format!("{} ({})", s.what, s.detail))
                        .collect();
                    eprintln!(
                        "verify: lost message {id} (key {}, seq {}): the store says {}: {}",
                        j.aggregate_id,
                        j.seq,
                        j.state.as_str(),
                        steps.join("; ")
                    );
                }
                None => eprintln!("verify: lost message {id}: the store does not hold it"),
            },
            Err(e) => eprintln!("verify: lost message {id}: its journey is unknown: {e}"),
        }
    }
}

/// Removes what a passed run made.
async fn clean_up(settings: &Settings, setup: &mut Setup, processes: Processes) {
    let db = &setup.db;
    if let Some((inbox, _)) = processes.inbox {
        let _ = bounded(inbox.destroy_queue()).await;
    }
    if settings.cdc && db.backend() == Backend::Postgres {
        // A slot left behind would hold WAL for good: one that cannot be dropped is said,
        // with what to do.
        if let Err(e) = drop_slot(db).await {
            eprintln!(
                "verify: the CDC slot of {} was not dropped ({e}); it holds WAL until \
                 `outbox migrate --cdc --drop` or pg_drop_replication_slot drops it",
                db.place()
            );
        }
    }
    if let Some(l) = &setup.logins {
        // Their sessions first: a login is dropped with what it holds in the schema.
        if let (Some(w), Some(o)) = (setup.writer_db.postgres(), setup.operator_db.postgres()) {
            w.pool().close().await;
            o.pool().close().await;
        }
        l.drop_all(db).await;
    }
    let _ = bounded(Database::clone(db).destroy()).await;
    let _ = tokio::time::timeout(PHASE_LIMIT, setup.reader.cleanup()).await;
    let _ = std::fs::remove_dir_all(&setup.tmp);
}

/// Drops the run's CDC slot and publication, trying for 10 s. The relays are gone and their
/// sessions let go of the slot within a moment, or, on a loaded server, not (the test suite
/// saw one outlive a 10 s wait): past 5 s the session still reading it is ended.
async fn drop_slot(db: &Database) -> outbox_core::Result<()> {
    let mut attempt = 0;
    loop {
        if attempt >= 50 && attempt % 10 == 0 {
            let _ = db.end_cdc_reader("relay").await;
        }
        match db.drop_cdc("relay").await {
            Err(_) if attempt < 99 => attempt += 1,
            done => return done,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Prints the last lines of every log in `dir` to stderr, so that CI's output shows what the
/// processes said before a failed check.
fn print_log_tails(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut logs: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    for path in logs {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().collect();
        eprintln!("verify: the last lines of {}:", path.display());
        for line in &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..] {
            eprintln!("  {line}");
        }
    }
}

/// How many lost messages a failed run looks up in the store.
const LOST_EXPLAINED: usize = 5;

/// How many lines of each process's log a failed run prints.
const LOG_TAIL_LINES: usize = 30;
