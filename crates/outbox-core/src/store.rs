//! The `Store` trait: how the relay claims, leases and completes messages in a database.
//!
//! Coordination shape (the Kafka consumer-group shape, held in the database): every message
//! belongs to one of a fixed number of *partitions* (a hash of its ordering key). Relay workers
//! are *members*; each owns a fair share of the partitions under a lease (owner + expiry) and
//! reads only its partitions, in sequence order. One owner per partition at a time gives per-key
//! order with any number of replicas; an expired lease lets another member take over.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::message::{Message, NewMessage};
use crate::Result;

/// Identity of one relay worker; unique per process run, so a restarted relay never mistakes
/// an old lease for its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MemberId(pub String);

impl MemberId {
    /// A new id `prefix/<random>`.
    pub fn random(prefix: &str) -> Self {
        Self(format!("{prefix}/{:016x}", fastrand::u64(..)))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for MemberId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// How much one [`Store::claim`] may hand out: the relay's memory follows these, whatever the
/// payloads weigh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimLimits {
    /// At most this many messages.
    pub rows: usize,
    /// At most this many payload bytes (the payloads' JSON text, as handed out) in all, except
    /// that the first message is handed out whatever its size: a payload larger than the bound
    /// goes through, alone.
    pub bytes: usize,
}

impl ClaimLimits {
    /// At most `rows` messages and no byte bound.
    pub fn rows(rows: usize) -> Self {
        Self {
            rows,
            bytes: usize::MAX,
        }
    }

    /// How many of `sizes` (payload sizes in hand-out order) one claim may hand out: the longest
    /// prefix within both bounds, and at least one when there is any. Stores that read more
    /// than they may hand out cut there; what they cut counts as not handed out.
    pub fn fit(&self, sizes: impl IntoIterator<Item = usize>) -> usize {
        let mut total = 0usize;
        let mut n = 0;
        for size in sizes {
            total = total.saturating_add(size);
            if n >= self.rows || (n > 0 && total > self.bytes) {
                break;
            }
            n += 1;
        }
        n
    }
}

/// The result of one publish attempt, recorded by [`Store::complete`].
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The broker acknowledged the message.
    Published {
        /// Row sequence.
        seq: i64,
    },
    /// The attempt failed; try again after `delay`. Later messages of the key wait.
    Retry {
        /// Row sequence.
        seq: i64,
        /// Sanitised error text.
        error: String,
        /// Backoff before the next attempt.
        delay: Duration,
    },
    /// The message was not tried because its sink is known to be unavailable (the sink's
    /// circuit is open while other sinks of the relay flow): wait `delay`, spending **no**
    /// attempt, so an outage of one sink can never push its messages into `failed`. Later
    /// messages of the key wait, as for [`Outcome::Retry`].
    Deferred {
        /// Row sequence.
        seq: i64,
        /// Sanitised error text: why the sink is considered unavailable.
        error: String,
        /// When to try again.
        delay: Duration,
    },
    /// The message is given up: an invalid message, or its budget spent. It stays visible,
    /// redrivable.
    Failed {
        /// Row sequence.
        seq: i64,
        /// Sanitised error text.
        error: String,
    },
}

impl Outcome {
    /// Sequence of the row this outcome is about.
    pub fn seq(&self) -> i64 {
        match self {
            Outcome::Published { seq }
            | Outcome::Retry { seq, .. }
            | Outcome::Deferred { seq, .. }
            | Outcome::Failed { seq, .. } => *seq,
        }
    }
}

/// What a `failed` message means for the later messages of its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFailed {
    /// Later messages of the key wait until the failed one is redriven or removed: per-key
    /// order holds without exception. The default.
    #[default]
    Block,
    /// Later messages of the key flow on; the failed one stays `failed`, visible and
    /// redrivable, and arrives out of order if redriven.
    Skip,
}

impl std::str::FromStr for OnFailed {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "block" => Ok(OnFailed::Block),
            "skip" => Ok(OnFailed::Skip),
            other => Err(format!("`{other}` is not block or skip")),
        }
    }
}

/// A key whose head message is waiting for a retry or has failed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BlockedKey {
    /// The ordering key.
    pub key: String,
    /// `retrying` or `failed`.
    pub state: String,
    /// Attempts made on the head message.
    pub attempts: i32,
    /// The head message's last error.
    pub last_error: Option<String>,
}

/// Counts for `outbox status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Stats {
    /// Messages not yet published (including those waiting for a retry).
    pub pending: i64,
    /// Age in seconds of the oldest pending message; the key health signal. `None` when none.
    pub oldest_pending_age_seconds: Option<f64>,
    /// Messages that ended `failed`.
    pub failed: i64,
    /// Messages published and still kept.
    pub published: i64,
    /// Pending messages waiting for a retry after a failed attempt.
    pub retrying: i64,
    /// Ordering keys whose head message is waiting for a retry or has failed.
    pub blocked_keys: i64,
    /// Messages set aside from the main flow: retrying or failed heads and the messages queued
    /// behind them in their key (PostgreSQL's `outbox_parked`; SQLite counts its retrying and
    /// failed rows).
    pub parked: i64,
    /// Partitions that hold the parking cap and stopped advancing until their parked keys
    /// drain: alert on anything above zero.
    pub partitions_at_parking_cap: i64,
    /// Of `pending`, the messages held back: heads waiting for a retry and the later messages
    /// of keys whose head is retrying or failed. The rest of `pending` can flow now.
    pub waiting: i64,
    /// Age in seconds of the oldest of the `waiting` messages (how long the longest-held key
    /// has been held at least); `None` when none waits.
    pub oldest_waiting_age_seconds: Option<f64>,
    /// Live relay members and the partitions each owns.
    pub members: Vec<MemberStatus>,
    /// Up to 20 blocked keys, with the head message's error.
    pub blocked: Vec<BlockedKey>,
}

/// One relay member as seen by `outbox status`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemberStatus {
    /// Member id.
    pub member: String,
    /// Partitions it owns.
    pub partitions: i64,
    /// Last heartbeat.
    pub heartbeat_at: DateTime<Utc>,
    /// The member's circuit breaker towards its sink: `closed`, `open` or `half-open`.
    pub circuit: String,
    /// The sink's last error while the circuit is not closed.
    pub sink_error: Option<String>,
}

/// A message that ended `failed`: its budget spent, or invalid. Listed by `outbox failed`,
/// released by [`Store::redrive`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailedMessage {
    /// Message id.
    pub id: uuid::Uuid,
    /// Store sequence.
    pub seq: i64,
    /// Kind of aggregate.
    pub aggregate_type: String,
    /// Ordering key.
    pub aggregate_id: String,
    /// Event type.
    pub event_type: String,
    /// Attempts made.
    pub attempts: i32,
    /// The last error (sanitised).
    pub last_error: Option<String>,
    /// When the row was written.
    pub created_at: DateTime<Utc>,
}

/// Which failed messages a listing concerns ([`Store::failed_matching`]): every field that is
/// set must match. Letter case is ignored (ASCII letters at least; a store may fold more).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailedFilter {
    /// The ordering key, exactly (case included).
    pub key: Option<String>,
    /// Part of `aggregate_type/event_type`, e.g. `order/order.placed`, `order/` or `placed`.
    pub kind: Option<String>,
    /// Part of the last error.
    pub error: Option<String>,
}

impl FailedFilter {
    /// Whether `m` matches: the rule every store's own filtering follows.
    pub fn matches(&self, m: &FailedMessage) -> bool {
        let contains =
            |hay: &str, needle: &str| hay.to_lowercase().contains(&needle.to_lowercase());
        self.key.as_deref().is_none_or(|k| m.aggregate_id == k)
            && self
                .kind
                .as_deref()
                .is_none_or(|k| contains(&format!("{}/{}", m.aggregate_type, m.event_type), k))
            && self
                .error
                .as_deref()
                .is_none_or(|e| contains(m.last_error.as_deref().unwrap_or(""), e))
    }

    /// Whether no field is set (every failed message matches).
    pub fn is_empty(&self) -> bool {
        self.key.is_none() && self.kind.is_none() && self.error.is_none()
    }
}

/// One page of the failed messages that match a [`FailedFilter`].
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FailedPage {
    /// How many failed messages match, in all (not only on this page).
    pub total: i64,
    /// The page: matching messages after the given sequence, oldest first.
    pub messages: Vec<FailedMessage>,
}

/// Which failed messages [`Store::redrive`] releases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedriveScope {
    /// Every failed message.
    All,
    /// The failed messages with these ids (ids of messages that are not failed are ignored).
    Ids(Vec<uuid::Uuid>),
}

/// What [`Store::maintain`] and [`Store::purge`] did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Maintenance {
    /// Storage segments created ahead of the writers.
    pub segments_created: u64,
    /// Segments dropped because every position had passed them and retention had run out.
    pub segments_dropped: u64,
    /// Bookkeeping rows deleted: superseded positions (PostgreSQL), or published rows past
    /// retention (a store that deletes instead of dropping).
    pub rows_deleted: u64,
    /// Rows a claim would pass over because they lie at or below their window's seq floor
    /// (PostgreSQL; a sampled check, see `floor_audit.sql`). Always 0 unless the floor is read
    /// wrong: the relay warns loudly when it is not.
    pub rows_below_floor: u64,
}

/// A database that holds outbox rows and coordinates relay members.
///
/// Guarantees every implementation must keep (the conformance suite in `outbox-testkit` checks
/// them): a partition has at most one owner whose lease is unexpired; `claim` returns only rows
/// of partitions the member owns, in sequence order, never a row whose key has an earlier row
/// waiting for a retry or failed; `complete` records nothing for partitions the member no longer
/// owns (fencing), so a relay that lost its lease cannot move the progress of a partition another
/// member now serves.
///
/// A member calls `complete` once for each non-empty `claim`, with an outcome for every message
/// it tried. A message handed out without an outcome is either behind a failure of its key in
/// the same batch (it then waits with that key, in order) or was not tried at all (the lease ran
/// short); the latter is handed out again, and so may later messages of its partition that were
/// published in the same batch (a duplicate with the same id, never a loss).
///
/// Every call may be abandoned: the relay drops a call that has not answered within its store
/// deadline. An implementation must stay consistent when any call is dropped at an await point,
/// and a dropped `complete` must succeed when called again with the same outcomes (its
/// statement may or may not have reached the database).
#[async_trait]
pub trait Store: Send + Sync {
    /// Registers `member` as live without taking any partition, so that members starting
    /// together count each other at their first [`Store::rebalance`] and each takes its fair
    /// share at once (otherwise the first takes every partition and hands the others' shares
    /// back a rebalance later, while they wait). Its liveness then lapses like any member's
    /// that stops heartbeating. The default registers nothing.
    async fn join(&self, member: &MemberId) -> Result<()> {
        let _ = member;
        Ok(())
    }

    /// Heartbeats `member`, forgets members silent for longer than `lease`, then takes or gives
    /// back partitions so each live member owns a fair share. Returns the partitions `member`
    /// owns afterwards; each of their leases runs for at least two thirds of `lease` from the
    /// call (a store may skip extending a lease that has that much left).
    async fn rebalance(&self, member: &MemberId, lease: Duration) -> Result<Vec<i32>>;

    /// Extends the lease of every partition `member` owns; returns how many it still owns.
    async fn renew(&self, member: &MemberId, lease: Duration) -> Result<usize>;

    /// Due pending messages of `partitions` (those `member` owns) within `limits` (rows, and
    /// payload bytes with one oversized message let through alone), in sequence order within
    /// each key. A key whose earliest pending message is waiting for a retry contributes
    /// nothing; nor, with [`OnFailed::Block`], does a key that has a failed message. Holds no
    /// transaction open after it returns, and never holds much more than `limits.bytes` of
    /// payloads in memory while it runs: a message beyond the bound is not read, and counts as
    /// not handed out.
    async fn claim(
        &self,
        member: &MemberId,
        partitions: &[i32],
        limits: ClaimLimits,
        on_failed: OnFailed,
    ) -> Result<Vec<Message>>;

    /// Whether `member`'s last claim stopped short of the end of what it may read, having
    /// spent the work one claim may do on rows it cannot hand out yet (a transaction still
    /// being written): the caller should claim again at once, even after an empty claim, instead
    /// of waiting as for an outbox read to its end. Each such claim records how far it read, so
    /// claiming again makes progress. The default: never.
    fn more_to_read(&self, member: &MemberId) -> bool {
        let _ = member;
        false
    }

    /// Reads the batch that follows the one `member` claimed last and has not recorded yet,
    /// while that batch is still being published: the rows `claim` would return once every
    /// message of the pending batch is recorded as published. It writes nothing and hands
    /// nothing out yet: the messages may be published only after [`Store::adopt_ahead`]
    /// answers `true`, and are dropped otherwise. A store returns nothing when it cannot tell
    /// what follows (the default: such stores simply never read ahead).
    ///
    /// This hides the claim's round trips behind the publish of a hot backlog; it changes no
    /// guarantee, because adoption is refused unless the pending batch was recorded exactly as
    /// the read ahead assumed.
    async fn claim_ahead(
        &self,
        member: &MemberId,
        partitions: &[i32],
        limits: ClaimLimits,
        on_failed: OnFailed,
    ) -> Result<Vec<Message>> {
        let _ = (member, partitions, limits, on_failed);
        Ok(Vec::new())
    }

    /// Makes the last [`Store::claim_ahead`] of `member` its current claim, to publish and
    /// `complete` like any claim, if the batch it followed was recorded in full, every message
    /// published, on partitions still owned at the same epoch, with no claim since. Returns
    /// whether it did; on `false` the messages read ahead must be dropped and `claim` called.
    async fn adopt_ahead(&self, member: &MemberId) -> bool {
        let _ = member;
        false
    }

    /// Records `outcomes` in one statement. Rows in partitions `member` no longer owns are left
    /// untouched (their new owner will deliver them again). Returns how many rows changed.
    async fn complete(&self, member: &MemberId, outcomes: &[Outcome]) -> Result<u64>;

    /// Records the state of `member`'s circuit breaker (`closed`, `open`, `half-open`) and the
    /// sink's last error, for `outbox status`.
    async fn report_health(
        &self,
        member: &MemberId,
        circuit: &str,
        sink_error: Option<&str>,
    ) -> Result<()>;

    /// Gives back every partition of `member` and its membership, so others take over at once.
    async fn release(&self, member: &MemberId) -> Result<()>;

    /// Sends on `wake` whenever new messages may be pending (e.g. PostgreSQL `LISTEN`). Runs
    /// until an error; stores without notifications return `Ok(())` at once and the relay polls.
    async fn listen(&self, wake: tokio::sync::watch::Sender<u64>) -> Result<()>;

    /// Counts for `outbox status`.
    async fn stats(&self) -> Result<Stats>;

    /// The figures a metrics scrape exports ([`crate::Gauges`]), in one statement whose cost
    /// does not grow with the backlog (a pending count stops at a cap), never one per
    /// partition. Read-only. The default derives them from [`Store::stats`].
    async fn gauges(&self) -> Result<crate::Gauges> {
        Ok(crate::Gauges::from_stats(&self.stats().await?))
    }

    /// Whether the database answers: the cheapest round trip the store has (`SELECT 1`), for
    /// readiness probes. The default reads [`Store::stats`].
    async fn ping(&self) -> Result<()> {
        self.stats().await.map(drop)
    }

    /// The rest of `outbox status`, for stores that can give it: each partition's owner, epoch
    /// and position, what keeps storage from being dropped, and the pending messages by
    /// partition and type (see [`crate::status`]). Read-only, a few statements, never one per
    /// partition. The default gives nothing.
    async fn status_detail(&self) -> Result<crate::status::StatusDetail> {
        Ok(crate::status::StatusDetail::default())
    }

    /// The pending messages by partition and type of [`Store::status_detail`], counting at most
    /// `cap` per partition (the oldest first, so the oldest age stays right when the count is
    /// capped): for metrics, which want it cheap. The default reads the whole status detail.
    async fn pending_by_type(&self, cap: i64) -> Result<Vec<crate::status::PendingCell>> {
        let _ = cap;
        Ok(self.status_detail().await?.pending)
    }

    /// Housekeeping a relay runs now and then: storage created ahead of the writers, and
    /// storage every reader has passed dropped once `retention` has run out since. Never
    /// removes a message that is pending or parked. Stores without such upkeep do nothing.
    async fn maintain(&self, retention: Duration) -> Result<Maintenance> {
        let _ = retention;
        Ok(Maintenance::default())
    }

    /// Up to `limit` messages that ended `failed`, oldest first, with their errors.
    async fn failed(&self, limit: usize) -> Result<Vec<FailedMessage>>;

    /// The failed messages that match `filter`: how many in all, and up to `limit` of them
    /// with a sequence above `after` (the last one of the page before; `None` from the start),
    /// oldest first. Right at any number of failed messages: stores filter and count in the
    /// database. The default reads every failed message and filters them here.
    async fn failed_matching(
        &self,
        filter: &FailedFilter,
        after: Option<i64>,
        limit: usize,
    ) -> Result<FailedPage> {
        let all: Vec<FailedMessage> = self
            .failed(usize::MAX)
            .await?
            .into_iter()
            .filter(|m| filter.matches(m))
            .collect();
        Ok(FailedPage {
            total: i64::try_from(all.len()).unwrap_or(i64::MAX),
            messages: all
                .into_iter()
                .filter(|m| after.is_none_or(|a| m.seq > a))
                .take(limit)
                .collect(),
        })
    }

    /// Gives failed messages a fresh budget: each goes back to waiting for its next attempt,
    /// due now, with its attempts at zero, and its key flows again behind it, in order (a
    /// message redriven under `--on-failed skip` arrives after the later messages of its key
    /// that flowed meanwhile). Every redriven message is recorded in the store's audit table
    /// (`outbox_redrives`: when, which message, its attempts and last error, and `reason`).
    /// Returns how many messages were redriven.
    async fn redrive(&self, scope: &RedriveScope, reason: &str) -> Result<u64>;

    /// Finds the messages `query` names (one by id, or a key's latest `limit`, newest first) and
    /// what the store knows of each: its write, parking, attempts, redrives and publication
    /// (see [`crate::journey`]). Read-only. The default answers that the store cannot tell.
    async fn journey(
        &self,
        query: &crate::JourneyQuery,
        limit: usize,
    ) -> Result<Vec<crate::Journey>> {
        let _ = (query, limit);
        Err(crate::Error::new(
            crate::ErrorKind::Other,
            "this store does not keep what a message's journey needs; use PostgreSQL",
        ))
    }

    /// Inserts `messages` in one transaction of the store's own. Applications should use the
    /// backend's transactional `enqueue` instead, inside their business transaction.
    async fn insert(&self, messages: &[NewMessage]) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_cut_a_prefix_and_let_one_oversized_message_through() {
        let l = ClaimLimits { rows: 3, bytes: 10 };
        assert_eq!(l.fit([4, 4, 4]), 2);
        assert_eq!(l.fit([4, 4, 1, 1]), 3, "rows bound");
        assert_eq!(l.fit([50, 1]), 1, "an oversized first message goes alone");
        assert_eq!(
            l.fit([1, 50, 1]),
            1,
            "a prefix: nothing after the first cut"
        );
        assert_eq!(l.fit(std::iter::empty::<usize>()), 0);
        assert_eq!(ClaimLimits::rows(2).fit([usize::MAX, usize::MAX, 1]), 2);
    }
}
