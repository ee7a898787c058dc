//! The CDC store's state in memory, apart from any I/O: the stream's transactions not yet
//! confirmed and the position confirmed, what is handed out, which keys hold messages back and in
//! what order, what a claim takes from the stream, and what a batch's outcomes settle. The store
//! around it (`mod.rs`, `claim.rs`, `complete.rs`) reads and writes the database.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use outbox_core::{ClaimLimits, Error, ErrorKind, Message, OnFailed, Outcome};
use tracing::warn;

use crate::cdc::stream::{Item, Stream};
use crate::cdc::sync::Gate;

/// Messages the relay holds back at most (waiting for a retry of their key's head, or behind
/// it) before it stops reading the stream; their payloads are bounded too, at four times the
/// worker's byte share.
const MAX_HELD: usize = 10_000;

/// Where a handed-out message came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    /// The stream: the transaction it belongs to (an index that only grows).
    Stream(u64),
    /// A row of `outbox_parked`, already durable.
    Parked { partition: i16, seq: i64 },
}

/// A message the store holds: handed out, or waiting in its key's queue.
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub(super) message: Message,
    pub(super) origin: Origin,
    /// Not handed out before this.
    pub(super) due: Instant,
    /// When the relay took it from the stream (or the parked table): how long it has waited.
    pub(super) taken: Instant,
    /// Stream order (0 for parked rows): a key's messages are handed out and parked in it.
    pub(super) order: u64,
    /// Why it cannot be published as written: it is never handed out, and is parked as
    /// `failed` when its turn comes (behind its key's earlier messages, never ahead of them).
    pub(super) malformed: Option<String>,
    /// The seq of the table row it came from (`None` for a logical message): parked, a row
    /// keeps it, so a polling relay that meets the same row parks it at the same place and a
    /// key's parked rows sort as polling sorts them.
    pub(super) row_seq: Option<i64>,
}

/// A transaction of the stream not yet confirmed.
#[derive(Debug)]
pub(super) struct Txn {
    /// Commit end position, once its Commit was read.
    pub(super) end: Option<u64>,
    /// Its messages neither published nor parked.
    pub(super) open: usize,
    /// Its messages.
    pub(super) messages: usize,
    /// When it committed.
    pub(super) committed_at: chrono::DateTime<chrono::Utc>,
}

/// A message to write into `outbox_parked`: `state` is `failed`, `waiting` or `retrying`.
pub(super) struct ToPark {
    pub(super) held: Held,
    pub(super) state: &'static str,
    pub(super) error: Option<String>,
}

/// `Instant` `at` as a wall-clock time (for a parked row's next attempt).
pub(super) fn wall(at: Instant) -> chrono::DateTime<chrono::Utc> {
    let now = Instant::now();
    let ahead = at.saturating_duration_since(now);
    chrono::Utc::now() + chrono::Duration::from_std(ahead).unwrap_or_default()
}

impl ToPark {
    /// A malformed message is parked `failed` with its reason, whatever `state` its key's
    /// turn would give it: redriven as `waiting`, it would be published as written.
    pub(super) fn new(mut held: Held, state: &'static str, error: Option<String>) -> Self {
        match held.malformed.take() {
            Some(why) => Self {
                held,
                state: "failed",
                error: Some(why),
            },
            None => Self { held, state, error },
        }
    }
}

#[derive(Default)]
pub(super) struct State {
    pub(super) stream: Option<Stream>,
    /// Handed out and not completed, by handout number.
    pub(super) inflight: HashMap<i64, Held>,
    /// Keys whose next messages wait (a retry, or messages behind one), in order.
    pub(super) held: HashMap<String, VecDeque<Held>>,
    /// Keys that have rows in `outbox_parked`: their new messages are parked behind them.
    pub(super) parked_keys: HashSet<String>,
    pub(super) next_parked_poll: Option<Instant>,
    pub(super) txns: VecDeque<Txn>,
    /// Index of `txns[0]`.
    pub(super) txn_base: u64,
    /// Handout numbers (the `seq` the worker sees); never reused, across reconnections.
    pub(super) next_handout: i64,
    /// The last stream order given (see [`Held::order`]).
    pub(super) next_order: u64,
    pub(super) confirmed: u64,
    /// The last claim's `on_failed`, for its outcomes.
    pub(super) on_failed: OnFailed,
    /// The checkpoint waiting for the slot to pass it.
    pub(super) mark: Option<Mark>,
    /// Messages of confirmed transactions since the last mark, and since the last maintenance:
    /// with none, maintenance sends no statement (an idle relay is silent).
    pub(super) handled_since_mark: usize,
    pub(super) handled_since_maintain: usize,
    /// `confirmed` at the last maintenance round that ran a statement.
    pub(super) confirmed_at_maintain: u64,
    /// Set while a claim or a complete awaits the database with memory already changed: found
    /// set by the next call, that call was dropped mid-way (the relay's store deadline), and
    /// what it held is only in the WAL now: the stream is read again from the confirmed
    /// position.
    pub(super) writing: bool,
    /// A transaction's Begin read from the stream that the synchronous-standby gate holds back:
    /// it and everything after it wait until a barrier covers it (see [`crate::cdc::sync`]).
    pub(super) peek: Option<Item>,
    /// When a message was last published: a key held while others flow is parked after
    /// [`super::CdcStore::with_park_after`]; while nothing flows at all (every sink down) nothing
    /// is.
    pub(super) last_published: Option<Instant>,
    /// The slot's read position (restart, confirmed) last written to `outbox_settings`.
    pub(super) persisted: Option<(u64, u64)>,
    /// `confirmed` when the read position was last written by [`super::CdcStore::save_soon`], and
    /// when.
    pub(super) saved_confirmed: u64,
    pub(super) saved_at: Option<Instant>,
}

/// A point the polling positions may move to once the slot confirmed `lsn` (cdc_mark.sql).
#[derive(Debug, Clone)]
pub(super) struct Mark {
    pub(super) snapshot: String,
    pub(super) floor: i64,
    /// A transaction id assigned after the floor was read (the checkpoint's `done_bound`).
    pub(super) bound: String,
    pub(super) lsn: u64,
    pub(super) at: chrono::DateTime<chrono::Utc>,
}

/// What one claim gathers within its limits: the messages it hands out, their bytes, and what
/// it parks.
pub(super) struct Batch {
    pub(super) limits: ClaimLimits,
    pub(super) out: Vec<Message>,
    pub(super) bytes: usize,
    pub(super) to_park: Vec<ToPark>,
}

impl Batch {
    pub(super) fn new(limits: ClaimLimits) -> Self {
        Self {
            limits,
            out: Vec::new(),
            bytes: 0,
            to_park: Vec::new(),
        }
    }

    /// Whether `m` fits in the batch: the first message always does (alone if oversized).
    pub(super) fn fits(&self, m: &Message) -> bool {
        let n = self.out.len();
        n == 0
            || (n < self.limits.rows
                && self.bytes.saturating_add(m.payload.len()) <= self.limits.bytes)
    }
}

/// What a batch's outcomes settled ([`State::settle`]): how many were the store's, the parked
/// rows published (partition, seq) and failed again (with their errors and attempts), and the
/// messages to park.
pub(super) struct Settled {
    pub(super) changed: u64,
    pub(super) done_parked: (Vec<i16>, Vec<i64>),
    pub(super) failed_parked: (Vec<i16>, Vec<i64>, Vec<String>, Vec<i32>),
    pub(super) to_park: Vec<ToPark>,
}

impl State {
    /// Parks what the relay holds of keys whose head has waited longer than the park-after
    /// bound while other messages were published (a route's sink down beside busy ones): the
    /// head `retrying`, due when it was, the rest `waiting` behind it. Their transactions can
    /// then be confirmed and the slot's WAL released; the parked path publishes them once due.
    /// Nothing is parked while nothing is published at all (every sink down): the slot keeps the
    /// WAL then, as the design has it, bounded by the slot's limits.
    pub(super) fn stuck_to_park(&mut self, now: Instant, park_after: Duration) -> Vec<ToPark> {
        let flowing = self
            .last_published
            .is_some_and(|at| now.duration_since(at) < park_after);
        if !flowing {
            return Vec::new();
        }
        let stuck: Vec<String> = self
            .held
            .iter()
            .filter(|(_, q)| {
                q.front().is_some_and(|h| {
                    matches!(h.origin, Origin::Stream(_))
                        && h.malformed.is_none()
                        && now.duration_since(h.taken) >= park_after
                })
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut out = Vec::new();
        for key in stuck {
            let Some(queue) = self.held.remove(&key) else {
                continue;
            };
            self.parked_keys.insert(key.clone());
            let mut first = true;
            for h in queue {
                if matches!(h.origin, Origin::Parked { .. }) {
                    continue; // durable already
                }
                let state = if first { "retrying" } else { "waiting" };
                first = false;
                out.push(ToPark::new(h, state, None));
            }
            warn!(key = %key, "a key held back for over {:?} while other keys flow (its sink down?) is parked, so the slot's WAL is released; it is published from outbox_parked once its sink is back", park_after);
        }
        out
    }

    /// Marks the transaction of `origin` one message closer to confirmable.
    pub(super) fn resolve(&mut self, origin: Origin) {
        if let Origin::Stream(t) = origin {
            if let Some(txn) = t
                .checked_sub(self.txn_base)
                .and_then(|i| self.txns.get_mut(i as usize))
            {
                txn.open = txn.open.saturating_sub(1);
            }
        }
    }

    /// Confirms the commit end of every leading transaction that is fully handled.
    pub(super) fn advance(&mut self) {
        let mut to = None;
        while let Some(t) = self.txns.front() {
            match t.end {
                Some(end) if t.open == 0 => {
                    to = Some(end);
                    self.handled_since_mark += t.messages;
                    self.handled_since_maintain += t.messages;
                    self.txns.pop_front();
                    self.txn_base += 1;
                }
                _ => break,
            }
        }
        if let Some(end) = to {
            self.confirm(end);
        }
    }

    pub(super) fn confirm(&mut self, lsn: u64) {
        if lsn > self.confirmed {
            self.confirmed = lsn;
            if let Some(stream) = &self.stream {
                stream.confirm.send_replace(lsn);
            }
        }
    }

    /// A message read from the stream, counted in its (current) transaction and given its
    /// stream order.
    pub(super) fn accept(&mut self, message: Message, now: Instant) -> Held {
        let txn = self.txn_base + self.txns.len() as u64 - 1;
        if let Some(t) = self.txns.back_mut() {
            t.open += 1;
            t.messages += 1;
        }
        self.next_order += 1;
        // A row of the table carries its seq; a logical message has none (0).
        let row_seq = (message.seq > 0).then_some(message.seq);
        Held {
            message,
            origin: Origin::Stream(txn),
            due: now,
            taken: now,
            order: self.next_order,
            malformed: None,
            row_seq,
        }
    }

    /// Everything handed out and not completed.
    pub(super) fn drain_inflight(&mut self) -> Vec<Held> {
        self.inflight.drain().map(|(_, h)| h).collect()
    }

    /// Puts `back` at the front of their keys' queues, each key in stream order.
    pub(super) fn requeue(&mut self, mut back: Vec<Held>) {
        back.sort_by_key(|h| h.order);
        for h in back.into_iter().rev() {
            self.held
                .entry(h.message.aggregate_id.clone())
                .or_default()
                .push_front(h);
        }
    }

    pub(super) fn hand_out(&mut self, mut held: Held, out: &mut Vec<Message>) {
        self.next_handout += 1;
        let n = self.next_handout;
        let mut m = held.message.clone();
        m.seq = n;
        held.message.seq = n;
        self.inflight.insert(n, held);
        out.push(m);
    }

    /// Whether a message of `key` is handed out and not completed. A scan of what is in flight
    /// (a batch at most): only a malformed message asks, and those are rare.
    pub(super) fn in_flight(&self, key: &str) -> bool {
        self.inflight
            .values()
            .any(|h| h.message.aggregate_id == key)
    }

    /// Hands out the due heads of the held keys into `batch`, oldest head first, each key's due
    /// prefix in order; a malformed head goes to be parked `failed` once nothing of its key is
    /// in flight (under block with what is held of its key behind it, `waiting`).
    pub(super) fn take_due(&mut self, now: Instant, on_failed: OnFailed, batch: &mut Batch) {
        // Oldest head first: the batch stays in stream (commit) order across keys too.
        let mut due: Vec<(u64, String)> = self
            .held
            .iter()
            .filter_map(|(k, q)| {
                q.front()
                    .filter(|h| h.due <= now)
                    .map(|h| (h.order, k.clone()))
            })
            .collect();
        due.sort_unstable();
        let due: Vec<String> = due.into_iter().map(|(_, k)| k).collect();
        for key in due {
            // The key's due prefix, in order: the worker sends a key's messages one after the
            // other and leaves those behind a failure without an outcome.
            // A malformed head waits until nothing of its key is in flight (the message before
            // it may still fail, and must be parked first).
            while let Some(h) = self.held.get(&key).and_then(|q| q.front()) {
                let ready = if h.malformed.is_some() {
                    !self.in_flight(&key)
                } else {
                    h.due <= now && batch.fits(&h.message)
                };
                if !ready {
                    break;
                }
                let Some(q) = self.held.get_mut(&key) else {
                    break;
                };
                let Some(h) = q.pop_front() else { break };
                if q.is_empty() {
                    self.held.remove(&key);
                }
                if h.malformed.is_some() {
                    // Its key's earlier messages are done: its turn to be parked as failed,
                    // and under block, what the relay holds of the key behind it.
                    batch.to_park.push(ToPark::new(h, "failed", None));
                    if on_failed == OnFailed::Block {
                        self.parked_keys.insert(key.clone());
                        for behind in self.held.remove(&key).into_iter().flatten() {
                            batch.to_park.push(ToPark::new(behind, "waiting", None));
                        }
                    }
                    continue;
                }
                batch.bytes += h.message.payload.len();
                self.hand_out(h, &mut batch.out);
            }
        }
    }

    /// Then the stream, unless the relay already holds as much as it may: a key waiting for
    /// a retry keeps its later messages here, and so does a lane whose sink is down; past
    /// the bound the relay stops reading and the server waits (memory stays bounded, the
    /// slot keeps the WAL).
    ///
    /// Returns the error that ended the stream, if it ended, and whether the synchronous-standby
    /// gate holds the next transaction back.
    pub(super) fn take_stream(
        &mut self,
        gate: &Gate,
        now: Instant,
        on_failed: OnFailed,
        batch: &mut Batch,
    ) -> (Option<Error>, bool) {
        let (held_n, held_bytes) = self
            .held
            .values()
            .flatten()
            .fold((0usize, 0usize), |(n, b), h| {
                (n + 1, b.saturating_add(h.message.payload.len()))
            });
        let full = held_n >= MAX_HELD || held_bytes >= batch.limits.bytes.saturating_mul(4);
        let mut ended = None;
        // Messages read from the stream by this claim, handed out or not: a claim never takes
        // more than a batch from the stream, so what waits in memory stays bounded.
        let mut taken = 0usize;
        let mut gated = false;
        while !full && batch.out.len() < batch.limits.rows && taken < batch.limits.rows {
            let item = match self.peek.take() {
                Some(item) => item,
                None => {
                    let Some(stream) = self.stream.as_mut() else {
                        break;
                    };
                    match stream.items.try_recv() {
                        Ok(b) => b.item,
                        Err(_) => break,
                    }
                }
            };
            match item {
                // A transaction the synchronous standby may not have yet waits, with all after
                // it, until a barrier covers it (crate::cdc::sync): never published for a
                // commit a failover could undo.
                Item::Begin {
                    commit_time,
                    final_lsn,
                } if !gate.passes(final_lsn) => {
                    self.peek = Some(Item::Begin {
                        commit_time,
                        final_lsn,
                    });
                    gated = true;
                    break;
                }
                Item::Begin { commit_time, .. } => self.txns.push_back(Txn {
                    end: None,
                    open: 0,
                    messages: 0,
                    committed_at: commit_time,
                }),
                Item::Commit { end_lsn } => {
                    if let Some(t) = self.txns.back_mut() {
                        t.end = Some(end_lsn);
                    }
                    self.advance();
                }
                Item::Idle { wal_end } => {
                    if self.txns.is_empty() {
                        self.confirm(wal_end);
                    }
                }
                Item::Ended(e) => {
                    ended = Some(e);
                    break;
                }
                Item::Message(m) | Item::Malformed(m, _)
                    if self.txns.back().is_none_or(|t| t.end.is_some()) =>
                {
                    // The stream promises Begin first; a message outside one is a protocol
                    // error, handled as a broken stream (it comes again).
                    let _ = m;
                    ended = Some(Error::new(
                        ErrorKind::Other,
                        "CDC stream: a message outside a transaction; will reconnect",
                    ));
                    break;
                }
                Item::Message(m) => {
                    taken += 1;
                    let held = self.accept(*m, now);
                    let key = held.message.aggregate_id.clone();
                    if self.parked_keys.contains(&key) {
                        batch.to_park.push(ToPark::new(held, "waiting", None));
                    } else if let Some(q) = self.held.get_mut(&key) {
                        q.push_back(held);
                    } else if batch.fits(&held.message) {
                        batch.bytes += held.message.payload.len();
                        self.hand_out(held, &mut batch.out);
                    } else {
                        self.held.entry(key).or_default().push_back(held);
                        break;
                    }
                }
                Item::Malformed(m, why) => {
                    taken += 1;
                    warn!(id = %m.id, aggregate_id = %m.aggregate_id, error = %why, "a CDC message cannot be published as written; parked as failed behind its key's earlier messages");
                    let mut held = self.accept(*m, now);
                    held.malformed = Some(why);
                    let key = held.message.aggregate_id.clone();
                    let earlier_held = self.held.contains_key(&key) || self.in_flight(&key);
                    if earlier_held && !self.parked_keys.contains(&key) {
                        // Earlier messages of its key are in flight or waiting for a retry:
                        // parked now, it would be redriven ahead of them.
                        self.held.entry(key).or_default().push_back(held);
                    } else {
                        if on_failed == OnFailed::Block {
                            self.parked_keys.insert(key);
                        }
                        batch.to_park.push(ToPark::new(held, "failed", None));
                    }
                }
            }
        }
        (ended, gated)
    }

    /// Takes a batch's `outcomes` out of what is in flight: published stream messages resolve
    /// their transactions, retried ones go back to their keys' queues (due after their delay),
    /// failed ones are to be parked (under block with what is held of their keys behind them),
    /// and what was handed out without an outcome goes back to its key's queue, in order.
    pub(super) fn settle(&mut self, outcomes: &[Outcome], now: Instant) -> Settled {
        let on_failed = self.on_failed;
        let mut changed = 0u64;
        let mut done_parked: (Vec<i16>, Vec<i64>) = (Vec::new(), Vec::new());
        let mut failed_parked: (Vec<i16>, Vec<i64>, Vec<String>, Vec<i32>) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut to_park = Vec::new();
        let mut back = Vec::new();
        // Keys a failure blocked in this batch: everything of theirs the relay still holds is
        // parked behind the failure, so nothing of the key overtakes it.
        let mut blocked: Vec<String> = Vec::new();
        for o in outcomes {
            let Some(mut h) = self.inflight.remove(&o.seq()) else {
                continue; // handed out by an earlier stream, or recorded already
            };
            changed += 1;
            if matches!(o, Outcome::Published { .. }) {
                self.last_published = Some(now);
            }
            match o {
                Outcome::Published { .. } => match h.origin {
                    Origin::Stream(_) => self.resolve(h.origin),
                    Origin::Parked { partition, seq } => {
                        done_parked.0.push(partition);
                        done_parked.1.push(seq);
                    }
                },
                Outcome::Retry { delay, .. } | Outcome::Deferred { delay, .. } => {
                    if matches!(o, Outcome::Retry { .. }) {
                        h.message.attempts += 1;
                    }
                    h.due = now + *delay;
                    back.push(h);
                }
                Outcome::Failed { error, .. } => {
                    h.message.attempts += 1;
                    if on_failed == OnFailed::Block {
                        self.parked_keys.insert(h.message.aggregate_id.clone());
                        blocked.push(h.message.aggregate_id.clone());
                    }
                    match h.origin {
                        Origin::Stream(_) => {
                            to_park.push(ToPark::new(h, "failed", Some(error.clone())))
                        }
                        Origin::Parked { partition, seq } => {
                            failed_parked.0.push(partition);
                            failed_parked.1.push(seq);
                            failed_parked.2.push(error.clone());
                            failed_parked.3.push(h.message.attempts);
                        }
                    }
                }
            }
        }
        // Handed out without an outcome (behind a failure of their key, or not tried): they go
        // back to their key's queue, in order, due now.
        back.extend(self.drain_inflight());
        // A key a failure blocked: what the relay holds of it from the stream is parked behind
        // the failure; its parked rows are in the table already, behind it, and come back
        // after the next redrive.
        for key in &blocked {
            back.extend(self.held.remove(key).into_iter().flatten());
        }
        let mut requeued = Vec::with_capacity(back.len());
        for h in back {
            let key = &h.message.aggregate_id;
            match h.origin {
                Origin::Stream(_) if self.parked_keys.contains(key) => {
                    to_park.push(ToPark::new(h, "waiting", None))
                }
                Origin::Parked { .. } if blocked.contains(key) => {}
                _ => requeued.push(h),
            }
        }
        self.requeue(requeued);
        Settled {
            changed,
            done_parked,
            failed_parked,
            to_park,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(key: &str) -> Message {
        Message {
            seq: 1,
            id: uuid::Uuid::now_v7(),
            aggregate_type: "order".into(),
            aggregate_id: key.into(),
            event_type: "created".into(),
            payload: bytes::Bytes::from_static(b"{}"),
            headers: "{}".into(),
            topic: None,
            created_at: chrono::Utc::now(),
            attempts: 0,
        }
    }

    fn begin(s: &mut State) {
        s.txns.push_back(Txn {
            end: None,
            open: 0,
            messages: 0,
            committed_at: chrono::Utc::now(),
        });
    }

    fn commit(s: &mut State, end: u64) {
        if let Some(t) = s.txns.back_mut() {
            t.end = Some(end);
        }
        s.advance();
    }

    #[test]
    fn a_transaction_is_confirmed_once_its_messages_and_all_before_it_are_resolved() {
        let mut s = State::default();
        let now = Instant::now();
        begin(&mut s);
        let a = s.accept(message("a"), now);
        let b = s.accept(message("b"), now);
        commit(&mut s, 100);
        begin(&mut s);
        let c = s.accept(message("c"), now);
        commit(&mut s, 200);
        assert_eq!(s.confirmed, 0, "nothing resolved yet");
        s.resolve(c.origin);
        s.advance();
        assert_eq!(s.confirmed, 0, "the first transaction is still open");
        s.resolve(a.origin);
        s.resolve(b.origin);
        s.advance();
        assert_eq!(
            s.confirmed, 200,
            "both transactions, never a position inside one"
        );
        assert_eq!((s.handled_since_mark, s.handled_since_maintain), (3, 3));
        assert!(s.txns.is_empty());
        // An idle position moves the confirmed one on; an older one never moves it back.
        s.confirm(300);
        s.confirm(250);
        assert_eq!(s.confirmed, 300);
    }

    #[test]
    fn handed_out_messages_go_back_to_their_key_in_stream_order() {
        let mut s = State::default();
        let now = Instant::now();
        begin(&mut s);
        let mut out = Vec::new();
        for _ in 0..3 {
            let h = s.accept(message("k"), now);
            s.hand_out(h, &mut out);
        }
        // Handout numbers are the seqs the worker sees, never reused.
        assert_eq!(out.iter().map(|m| m.seq).collect::<Vec<_>>(), [1, 2, 3]);
        assert!(s.in_flight("k") && !s.in_flight("other"));
        let back = s.drain_inflight();
        s.requeue(back);
        let orders: Vec<u64> = s.held["k"].iter().map(|h| h.order).collect();
        assert_eq!(orders, [1, 2, 3]);
        assert!(s.inflight.is_empty());
    }

    #[test]
    fn due_heads_go_out_oldest_first_and_a_malformed_head_is_parked_failed() {
        let mut s = State::default();
        let now = Instant::now();
        begin(&mut s);
        let first = s.accept(message("b"), now);
        let second = s.accept(message("a"), now);
        let mut bad = s.accept(message("m"), now);
        bad.malformed = Some("not JSON".into());
        let behind = s.accept(message("m"), now);
        s.requeue(vec![second, first, bad, behind]);
        let mut batch = Batch::new(ClaimLimits::rows(10));
        s.take_due(now, OnFailed::Block, &mut batch);
        let keys: Vec<&str> = batch.out.iter().map(|m| m.aggregate_id.as_str()).collect();
        assert_eq!(keys, ["b", "a"], "oldest head first");
        let parked: Vec<(&str, &str)> = batch
            .to_park
            .iter()
            .map(|p| (p.held.message.aggregate_id.as_str(), p.state))
            .collect();
        assert_eq!(parked, [("m", "failed"), ("m", "waiting")]);
        assert!(s.parked_keys.contains("m") && s.held.is_empty());
    }

    #[test]
    fn a_failure_under_block_parks_what_its_key_has_in_flight_behind_it() {
        let mut s = State {
            on_failed: OnFailed::Block,
            ..State::default()
        };
        let now = Instant::now();
        begin(&mut s);
        let mut out = Vec::new();
        for key in ["k", "k", "other"] {
            let h = s.accept(message(key), now);
            s.hand_out(h, &mut out);
        }
        commit(&mut s, 100);
        let settled = s.settle(
            &[
                Outcome::Failed {
                    seq: out[0].seq,
                    error: "rejected".into(),
                },
                Outcome::Published { seq: out[2].seq },
            ],
            now,
        );
        assert_eq!(settled.changed, 2);
        let parked: Vec<(i64, &str)> = settled
            .to_park
            .iter()
            .map(|p| (p.held.message.seq, p.state))
            .collect();
        assert_eq!(parked, [(1, "failed"), (2, "waiting")]);
        assert!(s.held.is_empty() && s.inflight.is_empty());
        assert!(s.last_published.is_some());
        // The transaction waits for its parked messages to be written.
        assert_eq!(s.confirmed, 0);
    }
}
