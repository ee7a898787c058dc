//! Layer 2, idempotent effects: helpers for effects that are safe to apply twice by
//! themselves, so a duplicate that slipped past layer 1 (or a consumer without it) changes
//! nothing. `docs/consumers.md` shows the three shapes; `tests/effects.rs` runs them:
//!
//! - **an upsert by business key**: `INSERT … ON CONFLICT (account_id) DO UPDATE SET balance =
//!   EXCLUDED.balance` sets a state, so applying it again sets the same state;
//! - **a conditional transition**: `UPDATE orders SET status = 'PAID' WHERE id = $1 AND status
//!   = 'PENDING'` moves only from the expected state; a repeat matches no row;
//! - **a ledger entry keyed by the message id**: `INSERT INTO ledger (message_id, …)` with the
//!   message id as primary key; the constraint rejects the duplicate ([`is_duplicate`] tells it
//!   from other errors; run the insert in a savepoint, or write `ON CONFLICT DO NOTHING`).
//!
//! Increments (`balance = balance + $1`) and inserts keyed by a fresh id are **not** idempotent:
//! they need layer 1, or a key from the message.

/// Whether `e` is a unique (or primary key) violation: the database rejected a duplicate,
/// which for an effect keyed by the message id means "already applied". PostgreSQL SQLSTATE
/// `23505`; SQLite extended codes 1555 (primary key) and 2067 (unique); MySQL error 1062
/// (`ER_DUP_ENTRY`, whose SQLSTATE `23000` other constraints share).
pub fn is_duplicate(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            db.is_unique_violation()
                || matches!(
                    db.code().as_deref(),
                    Some("23505") | Some("1555") | Some("2067")
                )
        }
        _ => false,
    }
}
