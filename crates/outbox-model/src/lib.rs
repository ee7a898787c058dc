//! An explicit-state model of the PostgreSQL relay's window/position protocol and its parking
//! (one partition), checked exhaustively with [stateright](https://docs.rs/stateright) by
//! `cargo test -p outbox-model`.
//!
//! # What is modelled
//!
//! - **Writers**: two or three transactions, each inserting one or two rows on keys `a`/`b`,
//!   interleaved in every possible way. A row's insert locks its key (the writer API's advisory
//!   lock, held to the end of the transaction), gets the transaction's txid on the first insert
//!   (from one global counter, so txid order is assignment order), then draws `seq`. Each
//!   transaction commits or rolls back, in any order. Snapshots follow PostgreSQL: `xmax` is
//!   `latestCompletedXid + 1`, `xip` the ids below it still running; an id at or above `xmax` is
//!   invisible even while it runs.
//! - **The sequence**: `nextval` is two atomic steps. Step 1 writes the tuple ahead to `last +
//!   K` while WAL is written (`K` is 32 in PostgreSQL, 2 in the model; every draw is modelled as
//!   a logged one, which only adds behaviours); step 2 sets `last += 1`. A *locked* floor read
//!   (`pg_sequence_last_value()`, `outbox_seq_floor()` since migration 5) returns `last`; an
//!   *unlocked* one (`SELECT last_value FROM` the sequence) returns what the tuple shows.
//! - **Positions** `(done, done_bound, done_floor, cur, cur_bound, cur_floor, cursor)`, appended,
//!   never updated; the latest one is the position.
//! - **Claims** (claim_window.sql), one atomic step under the statement's snapshot: read the
//!   latest position; with no window open, the statement's own snapshot becomes `cur`; read the
//!   window `visible in cur, not in done` above the cursor in three parts, exactly as the SQL
//!   does: **B**, txids in `xip(done)`; **A1**, `xmax(done) <= txid < done_bound`; **A2**,
//!   `txid >= done_bound` *and* `seq > done_floor` (the part that trusts the floor). Sorted by
//!   seq, at most `N` rows, all handed out and published at once. Fewer than `N` rows means the
//!   window is exhausted (`window_rows` below the per-partition limit): the new position closes
//!   it (`done := cur`, `done_bound := cur_bound`, `done_floor := cur_floor`, cursor 0);
//!   otherwise it keeps `done` and `cur` and moves the cursor to the last row handed out
//!   (ticket.rs `closed`/`kept`). With [`Config::walk_span`], A2 walks a bounded span of seqs
//!   as the SQL's `$13` does: when the span ends below the floor, rows above its end are not
//!   read, and a claim that finds fewer rows than its batch keeps the window open with the
//!   cursor at the span's end (`scan_to`). A claim that opened a window then reads the floor for it
//!   (`GREATEST(done_floor, floor)`) as a step of its own, since the statement reads it after
//!   taking its snapshot and writers draw in between: any floor read before the recording
//!   transaction gets its id is a valid one, and one read earlier could only be lower.
//! - **Records** (record.sql) are sent, may be given up on by the relay (deadline) and then
//!   either retried with the same batch or replaced by a fresh claim, and *land* later, at any
//!   point, in one step: the epoch fence (`FOR SHARE` on the partition row at the epoch claimed
//!   under), then **compare-and-append**: the record names the position its claim read
//!   (`prev_id`) and appends only if that position has no successor yet (the unique index on
//!   `(partition, prev_id)`), else writes nothing. Bounds left open become the recording
//!   transaction's id, assigned as it lands, after the claim's snapshot (`COALESCE(…,
//!   pg_current_xact_id())`): this is what makes the A1/A2 split sound.
//! - **Takeover**: the other relay member takes the partition at any point, bumping the epoch.
//!   The old owner goes on as a zombie (it may claim and publish, duplicating) until a record of
//!   its is fenced out.
//! - **Retention** (droppable.sql): segments are txid ranges (2 ids wide); `[a, b)` is dropped
//!   once `b <= pg_snapshot_xmin(done)` of the latest position, and its rows disappear from
//!   every later claim.
//!
//! - **Pruning** (prune_positions.sql): every position but the latest is removed, at any point.
//!   A record appends only behind a position that still exists (record.sql's `predecessor`).
//! - **Parking** under `--on-failed block` ([`parking`]): the sink may fail a message for good;
//!   the record that appends parks it `failed`, and parks `waiting` the rows of its key behind
//!   it and every row of a key with parked messages (`held`), unless that message is parked
//!   already. claim_parked hands out each key whose head is not failed up to its first failed
//!   row; a redrive makes failed messages due.
//! - **A CDC relay** first ([`Config::cdc`]): it reads committed rows key by key in commit order,
//!   publishes or parks them at their own seq, may checkpoint the polling position once, and
//!   loses its slot at any point, after which polling reads the same rows again.
//!
//! Left out: reading ahead, batch sharing and byte limits (each only hands out fewer rows, which
//! keeps a window open), several partitions (each has its own positions), lease timing, the
//! parking cap, retries that succeed later, the record that carries claim_parked's outcomes
//! (applied in one step with the publication, by the owner only), and A3. A3, the safety net under A2's floor (`txid >= done_bound AND seq <=
//! done_floor`), is off by default so that the model shows A2 needs no net once the floor is
//! read under the lock; [`Config::safety_net`] switches it on.
//!
//! # Invariants (checked in every reachable state)
//!
//! 1. **No loss**: every committed row that some landed position has passed (visible in its
//!    `done`, or in its open window at or below the cursor) was sent at least once.
//! 2. **Nothing rolled back is sent.**
//! 3. **Per-key order**: the first sends of each key are in seq order (writers lock the key
//!    before drawing seq, so per key seq order is commit order).
//! 4. **Positions never move backwards**: each position that becomes the latest has a `done`
//!    that sees everything the previous latest `done` saw, and with the same `done` continues the
//!    same window with a cursor no lower.
//! 5. **Retention** drops only rows that were sent, parked or rolled back, and never a segment
//!    a running transaction could still insert into.
//! 6. **No overtaking**: a row is first sent only once every committed row of its key with a
//!    lower seq was sent.
//! 7. **A failed message goes out only after a redrive.**
//!
//! (Invariant 1 counts a parked row as not lost: it is still the relay's to deliver.)
//!
//! Examples (`sometimes`) guard against a vacuous pass: every committed row delivered and
//! passed; a segment holding a sent row dropped; the new owner recording after a takeover; an
//! abandoned record running after the position it read was followed; a window whose cursor a
//! walk's span moved onto a row not sent; a redriven message delivered with its key; a record
//! naming a pruned position.
//!
//! # Results
//!
//! The fixed protocol (locked floor, compare-and-append behind an existing position, fence,
//! parking at own seqs) keeps all seven invariants over the whole state space of each
//! configuration of [`Config::portfolio`] and [`Config::parking_portfolio`] (writer races with batches of one and two rows,
//! abandoned records, a takeover, both together, walks of one seq, parking, the CDC fallback,
//! pruning: 0.1 to 2.6 million states each, about a minute in all). The planted bugs are found:
//!
//! - **Bug 1, unlocked floor** ([`Bugs::unlocked_floor`]): T0 gets txid 2 and is in the middle
//!   of `nextval` (the tuple shows 2, `last` is 0) when a claim opens a window and reads the
//!   floor: 2. The window closes, recorded by txid 3, so `done_floor = 2`, `done_bound = 3`. T0
//!   draws seq 1. T2 begins (txid 4), draws seq 2, commits. The next window's A2 wants `txid >= 3
//!   and seq > 2`: T2's row is skipped, the window closes over it, and it is never sent
//!   (invariant 1; 15 steps). With A3 on, the same bug loses nothing: A3 returns exactly the rows
//!   A2 skips, which is what the A3 rows seen in production were.
//! - **Bug 2, latest by highest id** ([`Bugs::latest_by_highest_id`]): a record is given up on
//!   and retried; the retry lands, the relay claims and records again; then the first record
//!   runs, draws the highest id, and becomes the latest position with the oldest `done`
//!   (invariant 4; 11 steps). The next claims hand out rows again. With compare-and-append it
//!   writes nothing.
//! - **Bug 3, rows past the span** ([`Bugs::rows_past_the_span`]): T1 (txid 2) draws seq 1 and,
//!   later, seq 3; T2 (txid 4) draws seq 2 between them and commits first; both commit. A window
//!   reads T1 by txid (A1) and walks one seq for A2: seq 1, T1's own. Handing out T1's seq 3
//!   too and moving the cursor to 3 passes T2's seq 2, which the walk never reached
//!   (invariant 1; 18 steps). Fixed, the claim keeps only seq 1 and the cursor stops at the
//!   span's end.
//!
//! - **Bug 4, the fallback re-parks** ([`Bugs::fallback_reparks`], engine review N2): T0's
//!   row a/1 fails under CDC and is parked at a fresh seq 3; a checkpoint passes T0 but not T1
//!   (a/2); the slot is lost; polling parks a/2 at its own seq 2, ahead of the failed a/1, and
//!   claim_parked publishes it (invariant 6; 16 steps). [`Bugs::parked_past_failed`]'s fix does
//!   not help (seq 2 is ahead of the failure); without the checkpoint a/1's own copy is
//!   published unredriven (invariant 7; 11 steps).
//! - **Bug 5, past a failed row** ([`Bugs::parked_past_failed`]) is not found: with parking at
//!   own seqs a failed message is its key's head, so the old rule never meets a row behind one.
//! - **Bug 6, pruning frees the successor slot** ([`Bugs::prune_frees_successor`], N4): a
//!   record is abandoned, its retry and a later record land, maintenance prunes the first two
//!   positions, and the abandoned record lands as the latest with the oldest `done`
//!   (invariant 4; 12 steps).
//!
//! Compare-and-append alone keeps these invariants: with the epoch fence removed, the checks
//! still pass, since a zombie's record that lands is a valid successor of a batch it did publish.
//! The fence still matters for what the model leaves out (parked rows written by a member that
//! lost the partition).

pub mod config;
pub mod explain;
pub mod model;
pub mod parking;
pub mod properties;
pub mod snapshot;
pub mod state;

pub use config::{Bugs, Config, Key};
pub use model::{Action, ProtocolModel};
pub use state::State;
