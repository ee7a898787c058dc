//! What a model run explores: the writers' transactions, the relay's batch size, the bounds that
//! keep the state space finite, and which planted bugs are switched on.

use std::fmt;

/// An aggregate key (`aggregate_id`); two are enough to mix per-key order with other keys.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// Key "a".
    A,
    /// Key "b".
    B,
}

impl Key {
    /// The key's bit in a writer's set of held locks.
    pub(crate) fn bit(self) -> u8 {
        match self {
            Key::A => 1,
            Key::B => 2,
        }
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Key::A => "a",
            Key::B => "b",
        })
    }
}

/// The defects the model can plant, each against the fix the protocol uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bugs {
    /// Bug 1: the seq floor is read without the sequence's buffer lock (`SELECT last_value FROM
    /// seq`), so a read during a logged `nextval` sees the value written ahead to WAL. Fixed:
    /// `pg_sequence_last_value()`, which reads under the lock.
    pub unlocked_floor: bool,
    /// Bug 2: the latest position is simply the one with the highest id, the id drawn when the
    /// record statement runs; any record lands, so a record the relay gave up on can land after
    /// newer ones. Fixed: compare-and-append (a record lands only as the successor of the
    /// position its claim read).
    pub latest_by_highest_id: bool,
    /// Bug 3: a claim whose A2 walk ended its span before the window's end still hands out the B
    /// and A1 rows past the span, and moves the cursor to the last of them. A2 rows between the
    /// span's end and that cursor were never read, so the window passes them. Fixed: the claim
    /// keeps only rows at or below the span's end.
    pub rows_past_the_span: bool,
    /// Bug 4, the fallback's re-parking (engine review N2): the CDC relay parks a message at a
    /// fresh seq (`nextval`), and polling, reading the same rows again from its position after
    /// the fallback, parks a row of a parked key unless that very seq is parked already, so a
    /// row gets a second, older copy ahead of its key's failed message. Fixed: CDC parks a table
    /// row at its own seq, and polling skips a row whose id is parked already.
    pub fallback_reparks: bool,
    /// Bug 5 (engine review N2b): claim_parked hands out every non-failed row of a key whose
    /// head is not failed, including rows behind a failed one. Fixed: under block only the rows
    /// below the key's first failed row. Defence in depth: the relay parks a key in seq order,
    /// so with bug 4 fixed a failed row is its key's head, and this bug alone loses nothing
    /// (the model shows it).
    pub parked_past_failed: bool,
    /// Bug 6 (engine review N4): compare-and-append checks only that the position a record
    /// read has no successor; once pruning removed that position and its successor, a record
    /// abandoned before lands and becomes the latest. Fixed: it appends only behind a position
    /// that still exists (`FOR KEY SHARE` on it).
    pub prune_frees_successor: bool,
}

/// One model run: the transactions, the relay, the bounds and the bugs.
#[derive(Clone, Debug)]
pub struct Config {
    /// One entry per writer transaction: the keys of the rows it inserts, in order. Keys are
    /// locked in this order, so give every writer the same key order (PostgreSQL would break a
    /// deadlock by rolling one back; a writer blocked on a lock may roll back here too).
    pub writers: Vec<Vec<Key>>,
    /// Rows a claim reads and hands out per partition (claim_window.sql's per-partition
    /// limit), at least 1.
    pub batch: u8,
    /// How far ahead of `last` a logged `nextval` writes the sequence tuple while it writes WAL
    /// (32 in PostgreSQL; 2 is enough to show the effect).
    pub wal_ahead: u8,
    /// Record statements the relays may start in all (bounds the state space: each can close a
    /// window and assign a transaction id).
    pub max_records: u8,
    /// Records the relays may give up on (deadline) before they land.
    pub max_abandons: u8,
    /// Takeovers of the partition by the other relay member.
    pub max_takeovers: u8,
    /// Transaction ids per retention segment.
    pub segment_width: u8,
    /// Whether the claim also reads A3, the safety net under A2's floor. Off by default: the
    /// model shows that A2 needs no net when the floor is read under the lock.
    pub safety_net: bool,
    /// The seqs A2's walk may span in one claim (claim_window.sql's `$13`), or `None` for an
    /// unbounded walk. A span that ends below the floor stops the claim there: only rows at or
    /// below it are read, and a claim that then finds fewer rows than its batch keeps the window
    /// open with the cursor at the span's end instead of closing it.
    pub walk_span: Option<u8>,
    /// Handed-out messages the sink may fail for good (`--on-failed block`): each is parked
    /// `failed` and holds its key until a redrive. With none (and no CDC phase) nothing is ever
    /// parked and the parking actions are off.
    pub max_failures: u8,
    /// Redrives of every failed message (`outbox redrive`) the operator may run.
    pub max_redrives: u8,
    /// Whether the run starts with a CDC relay, which publishes committed rows key by key and
    /// parks what fails (and its key's later rows) until the slot is lost and polling takes over
    /// from the position the CDC relay left, the migration's first one here (the checkpoint
    /// trails the slot; one that never moved is the widest re-read).
    pub cdc: bool,
    /// Prunes of superseded positions (prune_positions.sql): each removes every position but the
    /// latest, the most a prune may remove.
    pub max_prunes: u8,
    /// Which bugs are planted.
    pub bugs: Bugs,
}

impl Config {
    /// The fixed protocol with `writers`, batches of one row, three records, no fault.
    pub fn new(writers: Vec<Vec<Key>>) -> Self {
        Self {
            writers,
            batch: 1,
            wal_ahead: 2,
            max_records: 3,
            max_abandons: 0,
            max_takeovers: 0,
            segment_width: 2,
            safety_net: false,
            walk_span: None,
            max_failures: 0,
            max_redrives: 0,
            cdc: false,
            max_prunes: 0,
            bugs: Bugs::default(),
        }
    }

    /// Three writers racing (one on a, one on a then b, one on b), batches of one row.
    pub fn writers_race() -> Self {
        Self::new(vec![vec![Key::A], vec![Key::A, Key::B], vec![Key::B]])
    }

    /// The same writers, batches of two rows.
    pub fn batches_of_two() -> Self {
        Self {
            batch: 2,
            ..Self::writers_race()
        }
    }

    /// Two writers; the relay gives up on up to two records (retrying the batch, or claiming
    /// afresh), which may land at any later point.
    pub fn abandoned_records() -> Self {
        Self {
            batch: 2,
            max_records: 4,
            max_abandons: 2,
            ..Self::new(vec![vec![Key::A], vec![Key::A, Key::B]])
        }
    }

    /// Two writers; the other member takes the partition over at any point, while the first
    /// goes on as a zombie until a record of its is fenced out.
    pub fn takeover() -> Self {
        Self {
            max_takeovers: 1,
            ..Self::new(vec![vec![Key::A], vec![Key::A, Key::B]])
        }
    }

    /// One writer of two rows; an abandoned record and a takeover together.
    pub fn abandon_and_takeover() -> Self {
        Self {
            max_records: 4,
            max_abandons: 1,
            max_takeovers: 1,
            ..Self::new(vec![vec![Key::A, Key::B]])
        }
    }

    /// Three writers racing, batches of two rows, and a walk that spans one seq per claim: a
    /// window advances past seqs of rows it did not hand out (of a transaction still running,
    /// rolled back, or newer than `cur`).
    pub fn walk_span() -> Self {
        Self {
            walk_span: Some(1),
            ..Self::batches_of_two()
        }
    }

    /// Three writers racing (one on a, one on a then b, one on b), batches of two rows: the sink
    /// fails one message for good, whose key's later messages are parked behind it, and the
    /// operator redrives once.
    pub fn parking() -> Self {
        Self {
            max_failures: 1,
            max_redrives: 1,
            ..Self::batches_of_two()
        }
    }

    /// Two writers on one key, published first by a CDC relay that may fail one for good (and
    /// park its key's later message behind it) before its slot is lost; polling then reads the
    /// same rows again from the position CDC left, and the operator redrives once.
    pub fn cdc_fallback() -> Self {
        Self {
            batch: 2,
            max_failures: 1,
            max_redrives: 1,
            cdc: true,
            ..Self::new(vec![vec![Key::A], vec![Key::A]])
        }
    }

    /// Two writers; the relay gives up on one record, which may land at any later point, and
    /// maintenance prunes every superseded position once, at any point.
    pub fn pruning() -> Self {
        Self {
            batch: 2,
            max_records: 3,
            max_abandons: 1,
            max_prunes: 1,
            ..Self::new(vec![vec![Key::A], vec![Key::A, Key::B]])
        }
    }

    /// Whether anything can be parked in this run.
    pub fn parks(&self) -> bool {
        self.max_failures > 0 || self.cdc
    }

    /// Every configuration the fixed protocol is checked in, by name. Each is small enough to
    /// explore whole in seconds; together they cover writer races, batch sizes and relay faults
    /// (one model with all of them at once has tens of millions of states).
    pub fn portfolio() -> Vec<(&'static str, Self)> {
        vec![
            ("writers race", Self::writers_race()),
            ("batches of two", Self::batches_of_two()),
            ("abandoned records", Self::abandoned_records()),
            ("takeover", Self::takeover()),
            ("abandon and takeover", Self::abandon_and_takeover()),
            ("walk span", Self::walk_span()),
        ]
    }

    /// The configurations with parking, the CDC fallback and pruning, by name (checked apart from
    /// [`Self::portfolio`], so that neither check runs long).
    pub fn parking_portfolio() -> Vec<(&'static str, Self)> {
        vec![
            ("parking", Self::parking()),
            ("cdc fallback", Self::cdc_fallback()),
            ("pruning", Self::pruning()),
        ]
    }

    /// Rows planned in all.
    pub fn row_count(&self) -> usize {
        self.writers.iter().map(Vec::len).sum()
    }
}
