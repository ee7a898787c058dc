//! The properties checked in every reachable state: seven invariants (`always`), and examples
//! (`sometimes`) that show the interesting states are reached at all, so that a clean check
//! cannot come from a model that never gets anywhere.

use stateright::Property;

use crate::config::Config;
use crate::model::ProtocolModel;
use crate::state::{Position, State, TxStatus};

/// 1. A committed row some landed position has passed was sent at least once.
pub const NO_LOSS: &str = "no loss: every committed row a position has passed was sent";
/// 2. A rolled-back row is never sent.
pub const NO_ROLLED_BACK_SENT: &str = "nothing rolled back is ever sent";
/// 3. The first sends of each key are in seq order.
pub const KEY_ORDER: &str = "per-key order: the first sends of a key are in seq order";
/// 4. Each landed latest position is at or past the one before it.
pub const NEVER_BACKWARDS: &str = "positions never move backwards";
/// 5. Retention drops only segments whose rows were sent or rolled back, and that no running
///    transaction can still insert into.
pub const RETENTION: &str = "retention drops only rows that were sent or rolled back";

/// 6. Under block a key's messages go out in order or not at all: a row is first sent only
///    once every committed row of its key with a lower seq was sent.
pub const NO_OVERTAKING: &str =
    "no overtaking: a row goes out only after every earlier committed row of its key";
/// 7. A message parked as failed goes out only after a redrive.
pub const FAILED_HELD: &str = "a failed message goes out only after a redrive";

/// Example: every transaction ended, each committed row was sent, and the latest position has
/// passed them all.
pub const ALL_DELIVERED: &str = "example: every committed row delivered and passed";
/// Example: retention dropped a segment that held a committed row.
pub const SENT_ROW_DROPPED: &str = "example: a segment holding a sent row is dropped";
/// Example: the latest position was recorded by the member that took the partition over.
pub const NEW_OWNER_RECORDS: &str = "example: the new owner records after a takeover";

/// Example: a record its member gave up on ran after the position it read had been followed.
pub const LATE_RECORD: &str = "example: an abandoned record runs after its position was followed";

/// Example: a window is open with its cursor on a row that was never sent (the walk's span
/// ended there).
pub const SPAN_END: &str =
    "example: a walk's span ends on a row not sent, and the cursor moves there";

/// Example: a failed message was redriven, and every message went out, none left parked.
pub const REDRIVEN_DELIVERED: &str =
    "example: a failed message is redriven and its key delivered in order";

/// Example: a record was refused (or, with the bug, appended) naming a pruned position.
pub const PRUNED_RECORD: &str = "example: a record lands after the position it read was pruned";

/// Every property, in the order above; the examples of faults only where `cfg` allows them.
pub fn all(cfg: &Config) -> Vec<Property<ProtocolModel>> {
    let mut all = vec![
        Property::always(NO_LOSS, no_loss),
        Property::always(NO_ROLLED_BACK_SENT, no_rolled_back_sent),
        Property::always(KEY_ORDER, key_order),
        Property::always(NEVER_BACKWARDS, never_backwards),
        Property::always(RETENTION, retention),
        Property::always(NO_OVERTAKING, |_, s: &State| !s.overtaken),
        Property::always(FAILED_HELD, |_, s: &State| !s.failed_sent),
        Property::sometimes(ALL_DELIVERED, all_delivered),
        Property::sometimes(SENT_ROW_DROPPED, sent_row_dropped),
    ];
    if cfg.max_takeovers > 0 {
        all.push(Property::sometimes(NEW_OWNER_RECORDS, new_owner_records));
    }
    if cfg.max_abandons > 0 {
        all.push(Property::sometimes(LATE_RECORD, late_record));
    }
    if cfg.walk_span.is_some() {
        all.push(Property::sometimes(SPAN_END, span_end));
    }
    if cfg.max_redrives > 0 {
        all.push(Property::sometimes(REDRIVEN_DELIVERED, redriven_delivered));
    }
    if cfg.max_prunes > 0 {
        all.push(Property::sometimes(PRUNED_RECORD, |_, s: &State| {
            s.pruned_record
        }));
    }
    all
}

fn sent(s: &State, i: usize) -> bool {
    s.was_sent(i)
}

/// Whether `p` has passed a committed row of `s` that was not sent and is not parked (a
/// parked message is still the relay's to deliver, from the parked table).
pub fn passes_unsent(m: &ProtocolModel, s: &State, p: &Position) -> bool {
    s.rows.iter().enumerate().any(|(i, r)| {
        r.as_ref()
            .is_some_and(|row| m.passed(s, p, i, row) && !sent(s, i) && !s.is_parked(i))
    })
}

fn no_loss(m: &ProtocolModel, s: &State) -> bool {
    // Every landed position, not only the latest (each was checked as it landed): with the
    // bug a position can be superseded by an older one, and what it passed must still have been
    // sent.
    !s.passed_unsent && !passes_unsent(m, s, &s.latest)
}

fn no_rolled_back_sent(m: &ProtocolModel, s: &State) -> bool {
    (0..s.rows.len()).all(|i| {
        let w = usize::from(m.plan()[i].writer);
        !sent(s, i) || s.writers[w].status != TxStatus::RolledBack
    })
}

fn key_order(_: &ProtocolModel, s: &State) -> bool {
    !s.out_of_order
}

/// Whether `new`, landing after `old` as the latest position, is behind it: something `old`
/// had passed is not passed any more.
pub fn moves_back(old: &Position, new: &Position) -> bool {
    if !old.done.precedes(&new.done) {
        return true;
    }
    if old.done != new.done {
        return false;
    }
    // Same `done`: an open window must go on (same `cur`, cursor not lower); closing it would
    // have changed `done`.
    match (old.cur, new.cur) {
        (Some(a), Some(b)) => a.snapshot != b.snapshot || new.cursor < old.cursor,
        (Some(_), None) => true,
        _ => false,
    }
}

fn never_backwards(_: &ProtocolModel, s: &State) -> bool {
    !s.moved_back
}

fn retention(m: &ProtocolModel, s: &State) -> bool {
    let writers_ok = s.writers.iter().all(|w| match w.txid {
        // A transaction still running in a dropped segment could commit rows nobody can read.
        Some(t) if t < s.dropped_below => w.status != TxStatus::Running,
        _ => true,
    });
    writers_ok
        && s.rows.iter().enumerate().all(|(i, r)| match r {
            Some(row) if row.txid < s.dropped_below => {
                let w = usize::from(m.plan()[i].writer);
                s.writers[w].status == TxStatus::RolledBack || sent(s, i) || s.is_parked(i)
            }
            _ => true,
        })
}

fn all_delivered(m: &ProtocolModel, s: &State) -> bool {
    let latest = &s.latest;
    let ended = s.writers.iter().all(|w| w.status != TxStatus::Running);
    let mut committed = 0;
    let all = s.rows.iter().enumerate().all(|(i, r)| match r {
        Some(row) if m.visible(s, i, row, &latest.done) => {
            committed += 1;
            sent(s, i)
        }
        Some(_) => s.writers[usize::from(m.plan()[i].writer)].status == TxStatus::RolledBack,
        None => true,
    });
    ended && all && committed > 0
}

fn redriven_delivered(m: &ProtocolModel, s: &State) -> bool {
    s.redrives > 0 && s.parked.is_empty() && all_delivered(m, s)
}

fn sent_row_dropped(m: &ProtocolModel, s: &State) -> bool {
    s.rows.iter().enumerate().any(|(i, r)| {
        r.is_some_and(|row| {
            row.txid < s.dropped_below
                && s.writers[usize::from(m.plan()[i].writer)].status == TxStatus::Committed
        })
    })
}

fn new_owner_records(_: &ProtocolModel, s: &State) -> bool {
    s.latest.epoch >= 2
}

fn late_record(_: &ProtocolModel, s: &State) -> bool {
    s.late_record
}

fn span_end(_: &ProtocolModel, s: &State) -> bool {
    let p = &s.latest;
    p.cur.is_some()
        && p.cursor > 0
        && s.rows
            .iter()
            .enumerate()
            .any(|(i, r)| r.is_some_and(|row| row.seq == p.cursor) && !sent(s, i))
}
