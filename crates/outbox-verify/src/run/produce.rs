//! The load phase of a run: the producers write, the fault schedule runs, the independent
//! consumer reads the destination (and a `--mode switch` run switches a third of the way in);
//! then the producers and the schedule are stopped and the backlog left at the load's end is
//! measured.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use outbox_sinks::read::Reader;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::prepare::Setup;
use super::start::Processes;
use super::switch::{cdc_pending, cdc_wal_now, switch_to_cdc};
use super::{bounded, progress, Settings, PHASE_LIMIT};
use crate::checker::Arrival;
use crate::faults::{self, FaultEvent, Schedule};
use crate::workload::{self, Tally};

/// What the independent consumer has received.
#[derive(Default)]
pub(super) struct Received {
    pub arrivals: Vec<Arrival>,
    pub seen: HashSet<Uuid>,
    pub unreadable: usize,
}

impl Received {
    /// Reads what arrived since the last call. The broker may be down (a fault): then nothing
    /// is read and the next tick tries again.
    pub async fn poll(&mut self, reader: &mut dyn Reader, started: Instant) {
        let at = started.elapsed().as_secs_f64();
        let polled = reader.poll(Duration::from_millis(250)).await;
        self.unreadable += polled.unreadable;
        for e in polled.delivered {
            let payload_key = serde_json::from_slice::<serde_json::Value>(&e.payload)
                .ok()
                .and_then(|v| v["key"].as_str().map(str::to_string))
                .unwrap_or_default();
            self.seen.insert(e.id);
            self.arrivals.push(Arrival {
                id: e.id,
                key: e.key,
                payload_key,
                at,
            });
        }
    }
}

/// What the load left.
pub(super) struct Load {
    /// What the consumer received so far.
    pub got: Received,
    /// What did not stop in time (producers, later processes).
    pub stuck: Vec<String>,
    /// The producers' counts.
    pub tally: Arc<Tally>,
    /// When the load ended, in seconds of the run.
    pub load_end: f64,
    /// CDC mode: the WAL position at the load's end (the backlog is what the slot has not
    /// confirmed up to it).
    pub load_end_lsn: Option<String>,
    /// Messages pending when the load ended (-1: unknown).
    pub pending_at_load_end: i64,
    /// Every fault injected (the switch included).
    pub fault_log: Arc<Mutex<Vec<FaultEvent>>>,
    /// When the last fault ended, in seconds of the run.
    pub last_fault_end: f64,
}

/// Runs the load for `settings.duration` with the faults, reading the destination meanwhile.
pub(super) async fn produce(
    settings: &Settings,
    setup: &mut Setup,
    processes: &Processes,
) -> anyhow::Result<Load> {
    let started = processes.started;
    let duration = settings.duration;
    let stop = CancellationToken::new();
    let (producers, tally) = workload::spawn(
        setup.writer_db.clone(),
        settings.shape,
        settings.seed,
        setup.db.schema(),
        stop.clone(),
    );
    let fault_log = Arc::new(Mutex::new(Vec::<FaultEvent>::new()));
    let fault_task = faults::spawn(
        Schedule {
            kinds: settings.faults.clone(),
            interval: settings.fault_interval,
            duration,
            lease: settings.lease,
            broker_stop: settings.broker_stop.clone(),
            broker_start: settings.broker_start.clone(),
            db_restart: settings.db_restart.clone(),
            failover: settings.failover.clone(),
            network: setup.network.take(),
            vip: setup.vip.clone(),
        },
        processes.groups.clone(),
        fault_log.clone(),
        settings.seed,
        started,
        stop.clone(),
    );

    // The independent consumer, in this task.
    let mut got = Received::default();
    let mut switch_at = settings.switch.then_some(duration / 3);
    while started.elapsed() < duration {
        tokio::time::sleep(Duration::from_millis(200)).await;
        got.poll(setup.reader.as_mut(), started).await;
        if switch_at.is_some_and(|at| started.elapsed() >= at) {
            switch_at = None;
            let event = switch_to_cdc(setup, &processes.relays, started).await?;
            if let Ok(mut log) = fault_log.lock() {
                log.push(event);
            }
        }
    }
    stop.cancel();
    let load_end = started.elapsed().as_secs_f64();
    progress(
        started,
        "load over; waiting for the producers and the last fault",
    );
    // Every wait below is bounded: a run that cannot finish must fail with a reason, never
    // hang its caller (a CI job has a budget).
    let mut stuck = Vec::new();
    for (i, p) in producers.into_iter().enumerate() {
        let abort = p.abort_handle();
        if tokio::time::timeout(PHASE_LIMIT, p).await.is_err() {
            abort.abort();
            stuck.push(format!(
                "producer {i} had not stopped {PHASE_LIMIT:?} after the load"
            ));
        }
    }
    // In CDC mode the backlog is the WAL the slot has not confirmed up to here, and the parked
    // messages still to publish (the table's positions are the polling relay's).
    let load_end_lsn = if settings.cdc {
        bounded(cdc_wal_now(&setup.db)).await.ok()
    } else {
        None
    };
    let pending_at_load_end = match &load_end_lsn {
        Some(lsn) => bounded(cdc_pending(&setup.db, lsn.clone()))
            .await
            .unwrap_or(-1),
        None => bounded(setup.store.stats())
            .await
            .map(|s| s.pending)
            .unwrap_or(-1),
    };
    let fault_abort = fault_task.abort_handle();
    match tokio::time::timeout(PHASE_LIMIT + Duration::from_secs(120), fault_task).await {
        Ok(done) => done.context("fault task")?.context("injecting a fault")?,
        Err(_) => {
            fault_abort.abort();
            anyhow::bail!("the fault schedule did not finish within {PHASE_LIMIT:?} of the load");
        }
    }
    progress(started, "draining: every committed message must arrive");
    let last_fault_end = fault_log
        .lock()
        .ok()
        .and_then(|f| f.iter().map(|e| e.ended_seconds).reduce(f64::max))
        .unwrap_or(0.0);
    Ok(Load {
        got,
        stuck,
        tally,
        load_end,
        load_end_lsn,
        pending_at_load_end,
        fault_log,
        last_fault_end,
    })
}
