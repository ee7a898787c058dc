//! The check phase of a run: every process stopped (SIGTERM), an operator command as the
//! operator role, and the checker's verdict on what arrived against what was committed.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use outbox_db::Backend;

use super::drain::Drained;
use super::prepare::Setup;
use super::produce::Load;
use super::start::Processes;
use super::{progress, Settings, PHASE_LIMIT};
use crate::checker::{check as judge, FaultMark, WriterKind};
use crate::report::Report;

/// Stops the processes and judges the run.
pub(super) async fn check(
    settings: &Settings,
    setup: &Setup,
    processes: &Processes,
    load: Load,
    drained: Drained,
) -> anyhow::Result<Report> {
    let mut stuck = load.stuck;
    stuck.extend(stop_processes(processes).await?);
    // An operator command as the operator role: what `outbox status` needs, that role has.
    if setup.logins.is_some() {
        if let Err(e) =
            operator_status(&settings.program, &setup.operator_url, setup.db.schema()).await
        {
            stuck.push(format!("`outbox status` as the operator role: {e:#}"));
        }
    }

    // The checker.
    let faults = load.fault_log.lock().map(|f| f.clone()).unwrap_or_default();
    let fault_problems: Vec<String> = faults.iter().filter_map(|f| f.problem.clone()).collect();
    for p in &fault_problems {
        eprintln!("verify: {p}");
    }
    let marks: Vec<FaultMark> = faults
        .iter()
        .map(|f| FaultMark {
            kind: f.kind.clone(),
            at: f.at_seconds,
        })
        .collect();
    let (ledger, got, skipped_by_reader) = (&drained.ledger, &load.got, &drained.skipped_by_reader);
    let mut verdict = judge(ledger, &got.arrivals, &marks);
    // Found at the broker by a second reader: delivered, and reported apart.
    verdict.lost -= skipped_by_reader.len().min(verdict.lost);
    verdict.delivered += skipped_by_reader.len();
    verdict.lost_sample.retain(|id| {
        id.parse()
            .map_or(true, |id| !skipped_by_reader.contains(&id))
    });
    let Settings { cdc, switch, .. } = *settings;
    // MySQL/MariaDB orders the plain insert too (docs/sql-contract.md, section 8): there the
    // raw writers' keys are a guarantee, not information.
    // So does CDC mode: the WAL is in commit order, whatever the writer did.
    // Not in a switching run: the polling relays delivered part of them, in no such order.
    // Nor across a failover before PostgreSQL 17: the slot is lost with the old primary, and
    // the table's messages since the last checkpoint come again by polling (docs/cdc.md).
    let slot_lost = settings.faults.iter().any(|k| k == "failover");
    let raw_ordered = setup.db.backend() == Backend::Mysql || (cdc && !switch && !slot_lost);
    if raw_ordered {
        verdict.count_raw_order();
    }
    let mut faults_injected: BTreeMap<String, usize> = BTreeMap::new();
    for f in &faults {
        *faults_injected.entry(f.kind.clone()).or_default() += 1;
    }
    let inbox_ok = drained.inbox.as_ref().is_none_or(|i| i.effects.ok());
    let (shape, tally, pending) = (&settings.shape, &load.tally, drained.pending);
    let written_by = |kind: WriterKind| ledger.values().filter(|c| c.writer == kind).count();
    Ok(Report {
        ok: verdict.ok()
            && pending == 0
            && inbox_ok
            && stuck.is_empty()
            && fault_problems.is_empty()
            && drained.odd.ok(),
        seed: settings.seed,
        database: setup.place.clone(),
        sink: outbox_core::redact::url(&setup.sink_url),
        duration_seconds: settings.duration.as_secs_f64(),
        relays: settings.relays,
        producers: shape.producers,
        keys: shape.keys,
        committed: ledger.len(),
        rolled_back: tally.rolled_back.load(Ordering::Relaxed),
        delivered: verdict.delivered,
        received: got.arrivals.len(),
        lost: verdict.lost,
        phantoms: verdict.phantoms,
        order_violations: verdict.order_violations,
        order_sample: verdict.order_sample.clone(),
        mismatched: verdict.mismatched,
        unreadable: got.unreadable,
        pending_after_drain: pending,
        duplicates: verdict.duplicates,
        duplicates_after: verdict.duplicates_after,
        faults_injected,
        faults,
        drain_seconds_after_last_fault: (drained.drained_at - load.last_fault_end).max(0.0),
        pending_at_load_end: load.pending_at_load_end,
        drain_seconds_after_load: (drained.drained_at - load.load_end).max(0.0),
        lost_sample: verdict.lost_sample,
        skipped_by_reader: skipped_by_reader.len(),
        keys_written_by_several_producers: verdict.keys_written_by_several_producers,
        raw_producers: shape.raw_producers,
        raw_order: verdict.raw_order,
        raw_ordered,
        emit_producers: shape.emit_producers,
        emit_committed: written_by(WriterKind::Emit),
        mode: match (cdc, switch) {
            (_, true) => "switch",
            (true, false) => "cdc",
            (false, false) => "polling",
        },
        producer_errors: tally.errors.load(Ordering::Relaxed),
        xa_producers: shape.xa_producers,
        xa_committed: written_by(WriterKind::Xa),
        xa_rolled_back: tally.xa_rolled_back.load(Ordering::Relaxed),
        xa_one_phase: tally.xa_one_phase.load(Ordering::Relaxed),
        xa_recovered: tally.xa_recovered.load(Ordering::Relaxed),
        odd: drained.odd,
        inbox: drained.inbox,
        stuck,
    })
}

/// Stops every process group (SIGTERM, then [`STOP_GRACE`]); returns what did not stop well.
async fn stop_processes(processes: &Processes) -> anyhow::Result<Vec<String>> {
    progress(processes.started, "stopping the processes (SIGTERM)");
    let mut stuck = Vec::new();
    for group in &processes.groups {
        let group = group.clone();
        let stopped = tokio::task::spawn_blocking(move || {
            group
                .lock()
                .map(|mut r| r.stop_all(STOP_GRACE))
                .map_err(|_| anyhow::anyhow!("process list poisoned"))
        })
        .await
        .context("stopping processes")??;
        for s in &stopped {
            eprintln!("verify: {s}");
        }
        stuck.extend(stopped);
    }
    Ok(stuck)
}

/// How long the processes get to stop after SIGTERM: long enough for a relay to finish a
/// batch whose acknowledgement times out, short enough to keep a hang out of CI.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// Runs `outbox status --format json` as `url`'s login (the operator role): the command an
/// on-call engineer runs first must work with that role's grants.
async fn operator_status(program: &std::path::Path, url: &str, schema: &str) -> anyhow::Result<()> {
    let out = tokio::time::timeout(
        PHASE_LIMIT,
        tokio::process::Command::new(program)
            .args(["status", "--format", "json", "--schema", schema])
            .env("OUTBOX_DATABASE_URL", url)
            .env("OUTBOX_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("`outbox status` did not answer")??;
    anyhow::ensure!(
        out.status.success(),
        "exited with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .context("`outbox status --format json` did not print JSON")?;
    Ok(())
}
