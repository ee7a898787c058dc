//! The drain phase of a run: after the load, everything committed must arrive and the outbox
//! must empty; through the inbox, every committed message's effect must apply; the odd rows
//! must have ended `failed`.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use outbox_sinks::read::Reader;
use uuid::Uuid;

use super::prepare::Setup;
use super::produce::Load;
use super::start::Processes;
use super::switch::cdc_pending;
use super::{bounded, progress, Settings, INBOX_DAEMONS, INBOX_HANDLERS};
use crate::checker::{check_odd, Committed, FailedRow, OddVerdict};
use crate::effects::check_effects;
use crate::report::InboxReport;
use crate::workload;

/// What the drain found.
pub(super) struct Drained {
    /// Every committed message, by id.
    pub ledger: HashMap<Uuid, Committed>,
    /// Messages still pending after the drain (-1: unknown).
    pub pending: i64,
    /// When the last missing message arrived, in seconds of the run.
    pub drained_at: f64,
    /// Missing messages a second reader of the destination found there.
    pub skipped_by_reader: HashSet<Uuid>,
    /// Through the inbox: the effects' verdict.
    pub inbox: Option<InboxReport>,
    /// The odd rows' verdict.
    pub odd: OddVerdict,
}

/// Waits (bounded) until everything committed arrived and everything else is settled.
pub(super) async fn drain(
    settings: &Settings,
    setup: &mut Setup,
    processes: &Processes,
    load: &mut Load,
) -> anyhow::Result<Drained> {
    let started = processes.started;
    // Drain: everything committed must arrive, and the outbox must empty (a message whose
    // acknowledgement was lost in a fault arrives before the relay records it).
    let ledger = bounded(workload::ledger(&setup.db)).await?;
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut drained_at = started.elapsed().as_secs_f64();
    let mut pending = -1;
    let mut skipped_by_reader: HashSet<Uuid> = HashSet::new();
    let got = &mut load.got;
    loop {
        let missing = ledger.keys().filter(|id| !got.seen.contains(id)).count();
        if missing == 0 {
            pending = match &load.load_end_lsn {
                Some(lsn) => bounded(cdc_pending(&setup.db, lsn.clone()))
                    .await
                    .unwrap_or(-1),
                None => bounded(setup.store.stats())
                    .await
                    .map(|s| s.pending)
                    .unwrap_or(-1),
            };
            if pending == 0 {
                break;
            }
        }
        if Instant::now() > deadline {
            eprintln!(
                "verify: {missing} messages missing and {pending} pending after the drain timeout"
            );
            if missing > 0 {
                skipped_by_reader = fresh_read(setup.reader.as_mut(), &ledger, &got.seen).await;
                if skipped_by_reader.len() == missing {
                    pending = bounded(setup.store.stats())
                        .await
                        .map(|s| s.pending)
                        .unwrap_or(-1);
                }
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        got.poll(setup.reader.as_mut(), started).await;
        if missing > 0 {
            drained_at = started.elapsed().as_secs_f64();
        }
    }
    // Late duplicates (a resumed relay) get a moment to show up.
    tokio::time::sleep(Duration::from_secs(1)).await;
    got.poll(setup.reader.as_mut(), started).await;
    let inbox = match &processes.inbox {
        Some((inbox, _)) => Some(drain_inbox(inbox, &ledger, started, load.load_end).await?),
        None => None,
    };
    // The odd rows: each must have ended `failed` with its column named.
    let odd = if settings.shape.odd_rows > 0 {
        let rows = bounded(crate::mysql_producers::odd_rows(&setup.db)).await?;
        let failed = bounded(setup.store.failed(ODD_FAILED_READ)).await?;
        let failed: Vec<FailedRow> = failed
            .into_iter()
            .map(|f| FailedRow {
                seq: f.seq,
                error: f.last_error,
            })
            .collect();
        check_odd(&rows, &failed)
    } else {
        OddVerdict::default()
    };
    Ok(Drained {
        ledger,
        pending,
        drained_at,
        skipped_by_reader,
        inbox,
        odd,
    })
}

/// Through the inbox: waits (bounded) until every committed message's effect applied, and
/// judges the effects.
async fn drain_inbox(
    inbox: &outbox_inbox::InboxDatabase,
    ledger: &HashMap<Uuid, Committed>,
    started: Instant,
    load_end: f64,
) -> anyhow::Result<InboxReport> {
    progress(
        started,
        "through the inbox: every committed message's effect must apply",
    );
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut applied_at = started.elapsed().as_secs_f64();
    loop {
        let effects = bounded(crate::inbox::effects(inbox)).await?;
        let have: HashSet<Uuid> = effects.iter().map(|e| e.id).collect();
        let missing = ledger.keys().filter(|id| !have.contains(id)).count();
        if missing == 0 {
            break;
        }
        if Instant::now() > deadline {
            eprintln!("verify: {missing} effects missing after the drain timeout");
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        applied_at = started.elapsed().as_secs_f64();
    }
    // Late doubles (a resumed handler) get a moment to show up.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let effects = bounded(crate::inbox::effects(inbox)).await?;
    let ingested = bounded(crate::inbox::ingested(inbox)).await?;
    Ok(InboxReport {
        daemons: INBOX_DAEMONS,
        handlers: INBOX_HANDLERS,
        ingested,
        effects: check_effects(ledger, &effects),
        effects_drain_seconds_after_load: (applied_at - load_end).max(0.0),
    })
}

/// The missing messages (in `ledger`, not in `seen`) that a second reader of the destination,
/// from its start, finds there; empty where the reader cannot be opened again. Reads until
/// every missing one is found, the second reader goes [`FRESH_READ_QUIET`] without a message,
/// or [`FRESH_READ_LIMIT`] passes.
async fn fresh_read(
    reader: &mut dyn Reader,
    ledger: &HashMap<Uuid, Committed>,
    seen: &HashSet<Uuid>,
) -> HashSet<Uuid> {
    let mut found = HashSet::new();
    let Some(mut fresh) = reader.fresh_reader().await else {
        return found;
    };
    let missing: HashSet<Uuid> = ledger
        .keys()
        .filter(|id| !seen.contains(*id))
        .copied()
        .collect();
    let give_up = Instant::now() + FRESH_READ_LIMIT;
    let mut last_message = Instant::now();
    while Instant::now() < give_up && last_message.elapsed() < FRESH_READ_QUIET {
        let polled = fresh.poll(Duration::from_millis(500)).await;
        if !polled.delivered.is_empty() {
            last_message = Instant::now();
        }
        found.extend(
            polled
                .delivered
                .iter()
                .map(|d| d.id)
                .filter(|id| missing.contains(id)),
        );
        if found.len() == missing.len() {
            break;
        }
    }
    eprintln!(
        "verify: a second reader of the destination, from its start, found {} of the {} \
         missing messages there",
        found.len(),
        missing.len()
    );
    // Dropped here, before any clean-up deletes the destination: a Kafka consumer must be
    // closed before its topic goes (see the Kafka reader's `cleanup`).
    drop(fresh);
    found
}

/// How long [`fresh_read`] reads at most, and how long without a message ends it sooner.
const FRESH_READ_LIMIT: Duration = Duration::from_secs(60);
const FRESH_READ_QUIET: Duration = Duration::from_secs(5);

/// How many failed rows the odd-row check reads: more than a run writes odd rows.
const ODD_FAILED_READ: usize = 10_000;
