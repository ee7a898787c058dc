//! The report of `outbox verify`, as JSON (its keys are a contract: CI logs and
//! `docs/guarantees.md` quote them; keys are added, never renamed) or as text.

use std::collections::BTreeMap;

use serde::Serialize;

use super::faults::FaultEvent;
use crate::checker::{OddVerdict, RawOrder};
use crate::effects::EffectsVerdict;

/// The receiving side of a `--through-inbox` run.
#[derive(Debug, Serialize)]
pub struct InboxReport {
    /// `outbox inbox` daemon processes (one ingests, the others stand by).
    pub daemons: usize,
    /// Handler processes (inbox processors).
    pub handlers: usize,
    /// Messages recorded in the inbox (once each).
    pub ingested: i64,
    /// The effects against the ledger: applied, missing, duplicated, phantoms, mismatched,
    /// handler order violations (all but `effects_applied` must be 0).
    #[serde(flatten)]
    pub effects: EffectsVerdict,
    /// Seconds from the end of the load until every committed message's effect was applied.
    pub effects_drain_seconds_after_load: f64,
}

/// The checker's verdict and the run it judged.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Every guarantee held and the outbox drained.
    pub ok: bool,
    /// The seed: the same seed replays the same workload and fault schedule.
    pub seed: u64,
    /// Where the outbox lived (schema or file).
    pub database: String,
    /// The sink, password masked.
    pub sink: String,
    /// Length of the load, in seconds.
    pub duration_seconds: f64,
    /// Relay processes.
    pub relays: usize,
    /// Producers writing through the writer API.
    pub producers: usize,
    /// Keys they share.
    pub keys: usize,
    /// Committed messages, all producers.
    pub committed: usize,
    /// Transactions rolled back on purpose: none of their messages may arrive.
    pub rolled_back: usize,
    /// Committed messages that arrived (at least once).
    pub delivered: usize,
    /// Messages the reader received, duplicates included.
    pub received: usize,
    /// Committed messages that never arrived (must be 0).
    pub lost: usize,
    /// Arrived messages that no committed transaction wrote (must be 0).
    pub phantoms: usize,
    /// Writer-API keys only (must be 0).
    pub order_violations: usize,
    /// Up to ten order violations (writer API and raw keys), where they were.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub order_sample: Vec<String>,
    /// Arrivals whose key differs from the key their payload names (must be 0).
    pub mismatched: usize,
    /// Items the reader could not read as messages.
    pub unreadable: usize,
    /// Messages still pending in the outbox after the drain (must be 0).
    pub pending_after_drain: i64,
    /// Redeliveries of a message that had already arrived (allowed: at-least-once).
    pub duplicates: usize,
    /// Duplicates by the fault kind that preceded them.
    pub duplicates_after: BTreeMap<String, usize>,
    /// Faults injected, by kind.
    pub faults_injected: BTreeMap<String, usize>,
    /// Every fault, in order.
    pub faults: Vec<FaultEvent>,
    /// Seconds from the end of the last fault until everything had arrived.
    pub drain_seconds_after_last_fault: f64,
    /// Messages pending when the load stopped.
    pub pending_at_load_end: i64,
    /// Seconds from the end of the load until everything had arrived.
    pub drain_seconds_after_load: f64,
    /// A few lost message ids, to look up.
    pub lost_sample: Vec<String>,
    /// Messages the reader tailing the destination never received but a second reader, from
    /// the destination's start, found there (brokers that keep a log: Kafka): the broker holds
    /// them, and served them to the tailing reader after it had read past their place. Counted
    /// as delivered, not lost; a broker defect worth knowing of, since a consumer may skip them.
    pub skipped_by_reader: usize,
    /// Writer-API keys that two or more producers committed to.
    pub keys_written_by_several_producers: usize,
    /// Producers writing the plain `INSERT` without the per-key lock.
    pub raw_producers: usize,
    /// What order held for their keys (information, not a verdict, unless `raw_ordered`).
    pub raw_order: RawOrder,
    /// Whether the database orders a plain insert per key (MySQL/MariaDB), so the raw keys'
    /// violations are counted in `order_violations`.
    pub raw_ordered: bool,
    /// CDC mode: producers writing logical messages (`emit`, no row), and what they committed.
    pub emit_producers: usize,
    /// See `emit_producers`.
    pub emit_committed: usize,
    /// The relay checked: `polling` or `cdc`.
    pub mode: &'static str,
    /// Producer transactions that failed (faults); the ledger says which committed.
    pub producer_errors: usize,
    /// MySQL/MariaDB: producers writing in XA transactions (`XA START … XA PREPARE … XA
    /// COMMIT`), on keys of their own; their order counts.
    pub xa_producers: usize,
    /// Their committed messages (in `committed`).
    pub xa_committed: usize,
    /// Their transactions ended in `XA ROLLBACK` after the prepare (in `rolled_back`): none of
    /// their messages may arrive.
    pub xa_rolled_back: usize,
    /// Their transactions committed in one phase (`XA COMMIT … ONE PHASE`).
    pub xa_one_phase: usize,
    /// Their prepared transactions a fault cut off, resolved from another connection.
    pub xa_recovered: usize,
    /// MySQL/MariaDB: rows written against the SQL contract (`odd_rows`) and how many ended
    /// `failed` with their column named (`odd_failed_named`, must equal `odd_rows`).
    #[serde(flatten)]
    pub odd: OddVerdict,
    /// With `--through-inbox`: the effects the inbox handlers applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inbox: Option<InboxReport>,
    /// Processes or steps that did not stop when asked (a process that ignored SIGTERM and
    /// had to be killed, a producer that hung): each is a defect, so it fails the run.
    pub stuck: Vec<String>,
}

impl Report {
    /// The report as lines of text.
    pub fn print_text(&self) {
        for f in &self.faults {
            println!("  fault at {:>5.1}s: {}", f.at_seconds, f.detail);
        }
        println!(
            "  committed {}, rolled back {}, delivered {} ({} messages received)",
            self.committed, self.rolled_back, self.delivered, self.received
        );
        println!(
            "  lost {}   phantoms {}   order violations {}   mismatched {}   duplicates {} {:?}",
            self.lost,
            self.phantoms,
            self.order_violations,
            self.mismatched,
            self.duplicates,
            self.duplicates_after
        );
        println!(
            "  writer API: {} producers on {} keys, {} keys written by several producers",
            self.producers, self.keys, self.keys_written_by_several_producers
        );
        if self.raw_producers > 0 {
            let r = &self.raw_order;
            println!(
                "  plain INSERT without the lock ({}): {} producers, {} messages on {} keys \
                 ({} written by several producers); {} of {} adjacent deliveries out of commit order, \
                 on {} keys",
                if self.raw_ordered {
                    "ordered by the database: counted in order violations"
                } else {
                    "information"
                },
                self.raw_producers,
                r.committed,
                r.keys,
                r.keys_written_by_several_producers,
                r.adjacent_pairs_out_of_order,
                r.adjacent_pairs,
                r.keys_out_of_order
            );
        }
        if self.emit_producers > 0 {
            println!(
                "  emit (CDC, a logical message and no row; order counted): {} producers, {} \
                 messages committed",
                self.emit_producers, self.emit_committed
            );
        }
        if self.xa_producers > 0 {
            println!(
                "  XA (order counted): {} producers, {} messages committed ({} in one phase), {} \
                 rolled back after their prepare, {} prepared ones resolved after a fault",
                self.xa_producers,
                self.xa_committed,
                self.xa_one_phase,
                self.xa_rolled_back,
                self.xa_recovered
            );
        }
        if self.odd.odd_rows > 0 {
            println!(
                "  rows against the SQL contract (a ULID id, a zero date): {} written, {} failed \
                 with their column named",
                self.odd.odd_rows, self.odd.odd_failed_named
            );
            for s in &self.odd.odd_sample {
                println!("    not as promised: {s}");
            }
        }
        if self.skipped_by_reader > 0 {
            println!(
                "  {} messages the tailing reader never got were found by a fresh read of the \
                 destination from its start: the broker holds them but served them past the \
                 reader's place",
                self.skipped_by_reader
            );
        }
        if self.unreadable > 0 || self.pending_after_drain != 0 || self.producer_errors > 0 {
            println!(
                "  unreadable messages {}; pending after the drain {}; producer errors {}",
                self.unreadable, self.pending_after_drain, self.producer_errors
            );
        }
        println!(
            "  faults injected {:?}; {} pending when the load stopped; drained {:.1} s after the load, \
             {:.1} s after the last fault",
            self.faults_injected,
            self.pending_at_load_end,
            self.drain_seconds_after_load,
            self.drain_seconds_after_last_fault
        );
        if let Some(i) = &self.inbox {
            let e = &i.effects;
            println!(
                "  through the inbox: {} daemons, {} handler processes; {} messages ingested",
                i.daemons, i.handlers, i.ingested
            );
            println!(
                "  effects applied {}   missing {}   duplicated {}   phantoms {}   mismatched {}   \
                 handler order violations {}   (raw keys, information: {} pairs out of commit order); \
                 all applied {:.1} s after the load",
                e.effects_applied,
                e.effects_missing,
                e.effects_duplicated,
                e.effects_phantoms,
                e.effects_mismatched,
                e.handler_order_violations,
                e.raw_handler_pairs_out_of_order,
                i.effects_drain_seconds_after_load
            );
        }
        for s in &self.stuck {
            println!("  did not stop: {s}");
        }
        println!(
            "  verdict: {}",
            if self.ok {
                "every guarantee held"
            } else {
                "A GUARANTEE WAS BROKEN"
            }
        );
    }
}
