//! Request idempotency keys: a client retrying a request (a timeout, a double click, a proxy
//! replaying it) must not pay twice.
//!
//! [`crate::idempotent`]`(&mut tx, key, fingerprint, request)` runs inside the request's own
//! business transaction:
//!
//! 1. It takes a transaction-level lock on `key` **without waiting** (PostgreSQL
//!    `pg_try_advisory_xact_lock` on a 64-bit hash of the schema and key). Held by another
//!    transaction: a request under that key is in progress now → [`IdempotencyError::InProgress`];
//!    the caller answers "in progress" (HTTP 409 or 425) and the client retries later. It is
//!    never run twice at once.
//! 2. A stored key: same fingerprint → the stored result and event ids, with `replayed = true`,
//!    and nothing is enqueued; another fingerprint → [`IdempotencyError::Conflict`] (HTTP 422:
//!    the key was reused for a different request).
//! 3. Otherwise it runs `request`, enqueues the events it returns into the outbox, and stores
//!    the result and the events' ids under the key, all in `tx`.
//!
//! The caller commits. Everything the first request did, its key included, commits together or
//! not at all: a request that crashes or rolls back leaves no key behind, so its retry runs
//! again, and "in progress" is a lock held by a live transaction, never a row that would need a
//! lease to expire. What `request` does outside the database (an HTTP call to a payment
//! provider) is not covered: pass the key on to that provider's own idempotency key.
//!
//! SQLite runs one writing transaction at a time, and transactions that will write begin
//! `IMMEDIATE`: a second request under a key waits for the first to commit (up to the busy
//! timeout), then gets its stored result. It never runs twice either; it just waits instead of
//! answering "in progress".

use futures::future::BoxFuture;
use outbox_core::{ErrorKind, NewMessage};
use uuid::Uuid;

use crate::tables::InboxSchema;
use crate::tx::{InboxTx, StoredKey};

/// What a request returns to [`crate::idempotent`]: its result, stored for replays, and the
/// events to enqueue with it (enqueued by `idempotent` in the same transaction, their ids
/// stored with the result).
#[derive(Debug, Clone, PartialEq)]
pub struct Response<R> {
    /// The request's result (stored as JSON, returned as is to every repeat).
    pub result: R,
    /// Events the request emits.
    pub events: Vec<NewMessage>,
}

impl<R> Response<R> {
    /// A result without events.
    pub fn new(result: R) -> Self {
        Self {
            result,
            events: Vec::new(),
        }
    }

    /// Adds an event to enqueue with the result.
    pub fn event(mut self, event: NewMessage) -> Self {
        self.events.push(event);
        self
    }
}

/// The answer to a request under an idempotency key.
#[derive(Debug, Clone, PartialEq)]
pub struct Idempotent<R> {
    /// The first request's result.
    pub result: R,
    /// The ids of the events the first request enqueued.
    pub events: Vec<Uuid>,
    /// `true` when this is a repeat: the stored result, and nothing was run or enqueued now.
    pub replayed: bool,
}

/// Why a request under an idempotency key was not answered.
#[derive(Debug, thiserror::Error)]
pub enum IdempotencyError<E> {
    /// The key was first used with another request (another fingerprint): the client reused
    /// it by mistake.
    #[error("idempotency key `{key}` was first used for a different request")]
    Conflict {
        /// The key.
        key: String,
    },
    /// A request under the key is running now; retry later.
    #[error("a request with idempotency key `{key}` is in progress")]
    InProgress {
        /// The key.
        key: String,
    },
    /// The request itself failed; nothing is stored (roll the transaction back).
    #[error("the request failed")]
    Request(#[source] E),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] outbox_core::Error),
}

pub(crate) async fn run<T, R, E, F>(
    schema: &InboxSchema,
    tx: &mut T,
    key: &str,
    fingerprint: &str,
    request: F,
) -> Result<Idempotent<R>, IdempotencyError<E>>
where
    T: InboxTx,
    R: serde::Serialize + serde::de::DeserializeOwned,
    F: for<'a> FnOnce(&'a mut T) -> BoxFuture<'a, Result<Response<R>, E>>,
{
    if !tx.lock_key(schema, key).await? {
        return Err(IdempotencyError::InProgress { key: key.into() });
    }
    if let Some(stored) = tx.stored_key(schema, key).await? {
        if stored.fingerprint != fingerprint {
            return Err(IdempotencyError::Conflict { key: key.into() });
        }
        let result = serde_json::from_value(stored.result).map_err(|e| {
            outbox_core::Error::with_source(
                ErrorKind::Malformed,
                format!("the stored result of idempotency key `{key}` does not decode"),
                e,
            )
        })?;
        return Ok(Idempotent {
            result,
            events: stored.events,
            replayed: true,
        });
    }
    let response = request(tx).await.map_err(IdempotencyError::Request)?;
    tx.enqueue_events(schema, &response.events).await?;
    let result = serde_json::to_value(&response.result).map_err(|e| {
        outbox_core::Error::with_source(
            ErrorKind::Other,
            format!("the result of the request under idempotency key `{key}` does not encode"),
            e,
        )
    })?;
    let events: Vec<Uuid> = response.events.iter().map(|e| e.id).collect();
    let stored = StoredKey {
        fingerprint: fingerprint.to_string(),
        result,
        events: events.clone(),
    };
    match tx.store_key(schema, key, &stored).await {
        Ok(()) => {}
        // A transaction whose snapshot predates the first request's commit (REPEATABLE READ)
        // missed its key above; the key's primary key stops it here. Its transaction must roll
        // back; a retry replays the stored result.
        Err(e) if e.kind() == ErrorKind::UniqueViolation => {
            return Err(IdempotencyError::InProgress { key: key.into() })
        }
        Err(e) => return Err(e.into()),
    }
    Ok(Idempotent {
        result: response.result,
        events,
        replayed: false,
    })
}
