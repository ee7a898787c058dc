//! The model's state: writer transactions, the sequence, the outbox rows, the appended
//! position, record statements in flight, the two relay members and what was sent, with the
//! few facts about the past the properties need (kept as flags, not as a history).

use crate::snapshot::{Seq, Snapshot, Xid};

/// Where a writer transaction stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TxStatus {
    /// Still running (possibly not begun: no row inserted, no id yet).
    Running,
    /// Committed: its rows become visible to snapshots taken from now on.
    Committed,
    /// Rolled back: its rows are never visible to anyone.
    RolledBack,
}

/// One writer transaction.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Writer {
    /// Running, committed or rolled back.
    pub status: TxStatus,
    /// Its id, assigned by its first insert.
    pub txid: Option<Xid>,
    /// The index (in its plan) of the next row to insert.
    pub next_row: u8,
    /// Keys whose advisory lock it holds (a: bit 0, b: bit 1), until it ends.
    pub locks: u8,
}

/// The outbox's `seq` sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sequence {
    /// The highest value handed out.
    pub last: Seq,
    /// The writer between the two steps of a logged `nextval`: the tuple shows
    /// `last + wal_ahead` until it finishes. Only one at a time (the buffer lock).
    pub drawing: Option<u8>,
}

/// An inserted outbox row (uncommitted, committed or rolled back: its writer says which).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    /// Its writer's id.
    pub txid: Xid,
    /// Drawn after the id was assigned, with the row's key locked.
    pub seq: Seq,
}

/// An open window in a landed position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    /// `cur`: the snapshot the window reads up to.
    pub snapshot: Snapshot,
    /// `cur_bound`: an id assigned after `cur` was taken (the first record of this window).
    pub bound: Xid,
    /// `cur_floor`: a seq at least every seq drawn before `cur` was taken.
    pub floor: Seq,
}

/// A row of `outbox_positions`: how far the partition has been handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Position {
    /// The epoch it was recorded under (0 for the one the migration made).
    pub epoch: u8,
    /// Every row of a transaction completed in `done` has been handled.
    pub done: Snapshot,
    /// An id assigned after `done` was taken: ids at or above it began after `done`.
    pub done_bound: Xid,
    /// The seq floor read before `done` was taken.
    pub done_floor: Seq,
    /// The open window, if any.
    pub cur: Option<Window>,
    /// The last seq handled inside the open window (0 with none open).
    pub cursor: Seq,
}

/// An open window in a position a claim computed: bounds not yet known are `None` and become
/// the recording transaction's id when it lands (record.sql's `COALESCE(…,
/// pg_current_xact_id())`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DraftWindow {
    /// `cur`.
    pub snapshot: Snapshot,
    /// `cur_bound`, when an earlier record of this window set it.
    pub bound: Option<Xid>,
    /// `cur_floor`.
    pub floor: Seq,
}

/// The position a claim will record once its batch is published.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Draft {
    /// The new `done`.
    pub done: Snapshot,
    /// The new `done_bound`, or `None`: the recording transaction's id.
    pub done_bound: Option<Xid>,
    /// The new `done_floor`.
    pub done_floor: Seq,
    /// The window left open, if any.
    pub cur: Option<DraftWindow>,
    /// The new cursor.
    pub cursor: Seq,
}

impl State {
    /// Whether row `i` was sent at least once.
    pub fn was_sent(&self, i: usize) -> bool {
        self.sent & (1 << i) != 0
    }

    /// Whether a copy of row `i` is parked.
    pub fn is_parked(&self, i: usize) -> bool {
        self.parked.iter().any(|p| usize::from(p.row) == i)
    }

    /// Whether a copy of row `i` is parked `failed`.
    pub fn is_failed(&self, i: usize) -> bool {
        self.parked
            .iter()
            .any(|p| usize::from(p.row) == i && p.failed)
    }
}

impl Draft {
    /// The position as it lands, recorded by transaction `xid`.
    pub fn land(&self, epoch: u8, xid: Xid) -> Position {
        Position {
            epoch,
            done: self.done,
            done_bound: self.done_bound.unwrap_or(xid),
            done_floor: self.done_floor,
            cur: self.cur.map(|w| Window {
                snapshot: w.snapshot,
                bound: w.bound.unwrap_or(xid),
                floor: w.floor,
            }),
            cursor: self.cursor,
        }
    }
}

/// A row of `outbox_parked`: a copy of a message, at a seq of its own (the primary key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Parked {
    /// The seq it is parked at (ordered first: the table's key order within a key).
    pub seq: Seq,
    /// The message: its index in [`State::rows`].
    pub row: u8,
    /// `failed` (holds its key until a redrive), else waiting (due).
    pub failed: bool,
}

/// A claim whose batch has been published: what its record will carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Claimed {
    /// The id of the position the claim read (see [`State::latest_id`]).
    pub prev: u8,
    /// The epoch the relay claimed under (the fence).
    pub epoch: u8,
    /// The position to append.
    pub next: Draft,
    /// Rows to park `waiting` (held behind their key's parked rows, or behind a failure in
    /// this batch): bit `i` for row `i`. Parked only if the record appends.
    pub park: u16,
    /// Rows the sink failed for good, to park `failed`.
    pub fail: u16,
}

/// What a relay member is doing with its partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Ready to claim.
    Idle,
    /// A batch claimed and published; the claim, which opened a window, still has to read its
    /// floor.
    ReadingFloor(Claimed),
    /// A batch claimed and published, not yet recorded.
    Published(Claimed),
    /// Waiting for record statement `record` to land.
    Recording {
        /// The record statement's id in [`State::in_flight`].
        record: u8,
        /// The batch it records.
        claimed: Claimed,
    },
}

/// A relay member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Relay {
    /// The epoch it believes it holds the partition at (`None`: not an owner). A member that
    /// lost the partition keeps believing until a record of its is fenced out.
    pub epoch: Option<u8>,
    /// Its current step.
    pub stage: Stage,
}

/// A record statement sent and not landed yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Record {
    /// Its id (the order records were started in).
    pub id: u8,
    /// The member that sent it.
    pub relay: u8,
    /// What it records.
    pub claimed: Claimed,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The next transaction id to assign.
    pub next_xid: Xid,
    /// `latestCompletedXid`.
    pub latest_completed: Xid,
    /// The seq sequence.
    pub sequence: Sequence,
    /// The writer transactions, as in [`crate::Config::writers`].
    pub writers: Vec<Writer>,
    /// The planned rows in order (writer by writer), once inserted.
    pub rows: Vec<Option<Row>>,
    /// The latest position: the last one landed (see [`crate::model`]).
    pub latest: Position,
    /// Its id: positions landed before it (the migration's first position is 0).
    pub latest_id: u8,
    /// Set when a position landed that had passed a committed row not sent by then. What a
    /// position has passed is fixed when it lands (its snapshots are, and so is every row of a
    /// transaction they saw completed) and sends only accumulate, so checking each position as
    /// it lands checks it in every later state too, without keeping the history.
    pub passed_unsent: bool,
    /// Set when a position landed behind the latest one before it (checked as it lands, like
    /// `passed_unsent`).
    pub moved_back: bool,
    /// Record statements started and not landed.
    pub in_flight: Vec<Record>,
    /// Record statements started in all.
    pub records_started: u8,
    /// Records given up on in all.
    pub abandoned: u8,
    /// The two relay members.
    pub relays: [Relay; 2],
    /// The partition's current epoch (the fencing token).
    pub epoch: u8,
    /// Takeovers so far.
    pub takeovers: u8,
    /// Segments below this id have been dropped.
    pub dropped_below: Xid,
    /// Set when a record its member had given up on ran after the position its claim read had
    /// been followed (the case compare-and-append exists for).
    pub late_record: bool,
    /// Rows sent at least once: bit `i` for row `i` of [`State::rows`].
    pub sent: u16,
    /// Set when a row was first sent after a row of the same key with a higher seq. Only the
    /// order of first sends within a key matters, so a flag set at each first send replaces the
    /// log of sends (whose interleavings across keys would only multiply states).
    pub out_of_order: bool,
    /// Set when a row was first sent while a committed row of its key with a lower seq had not
    /// been sent (under `block`, a key's messages go out in order or not at all).
    pub overtaken: bool,
    /// Set when a row was sent while a copy of it was parked `failed` (a failed message goes out
    /// only after a redrive).
    pub failed_sent: bool,
    /// The parked table, in seq order.
    pub parked: Vec<Parked>,
    /// Sink failures so far.
    pub failures: u8,
    /// Redrives so far.
    pub redrives: u8,
    /// The CDC relay still runs (its slot not lost yet): polling has not started.
    pub cdc: bool,
    /// Rows the CDC relay has handled (published or parked): bit `i` for row `i`.
    pub cdc_handled: u16,
    /// Prunes so far.
    pub prunes: u8,
    /// Positions with a lower id have been pruned.
    pub pruned_below: u8,
    /// Set when a record naming a pruned position was refused (or, with the bug, appended).
    pub pruned_record: bool,
    /// The CDC relay has checkpointed (once at most).
    pub checkpointed: bool,
}
