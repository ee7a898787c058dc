//! [`Inbox`]: the dedupe claim, ingest and request idempotency keys, inside the caller's
//! transaction, for one inbox's tables.

use outbox_core::Result;
use uuid::Uuid;

use crate::idempotency::{self, IdempotencyError, Idempotent, Response};
use crate::message::InboxMessage;
use crate::tables::InboxSchema;
use crate::tx::InboxTx;

/// One inbox's tables (on PostgreSQL, its schemas; SQLite's names are fixed). Cheap to clone;
/// holds no connection: every call runs in the transaction it is given.
#[derive(Debug, Clone, Default)]
pub struct Inbox {
    schema: InboxSchema,
}

impl Inbox {
    /// The inbox whose tables are in `schema` (see [`InboxSchema`]).
    pub fn new(schema: InboxSchema) -> Self {
        Self { schema }
    }

    /// Its schemas.
    pub fn schema(&self) -> &InboxSchema {
        &self.schema
    }

    /// **Layer 1, the dedupe claim.** Records that `consumer` processes `message_id`, inside
    /// `tx`, the transaction that applies the message's effect. `true`: this is the first
    /// claim, apply the effect and commit. `false`: the message was already processed (or is
    /// being processed by a transaction that then commits): do nothing, and acknowledge it.
    ///
    /// Guarantee: of all transactions that claim the same `(consumer, message_id)`, at most one
    /// commits with `true`. A second claimer waits on the primary key until the first ends: if
    /// the first commits, the second gets `false`; if it rolls back, the second gets `true`.
    /// So a redelivery, a race between two consumers, or a crash after the commit and before
    /// the broker's ack all end with the effect applied once. The claim lives as long as the
    /// inbox retention; it must outlast the broker's longest redelivery window
    /// (docs/consumers.md).
    pub async fn claim<T: InboxTx>(
        &self,
        tx: &mut T,
        consumer: &str,
        message_id: Uuid,
    ) -> Result<bool> {
        tx.claim_message(&self.schema, consumer, message_id).await
    }

    /// **The inbox.** Records `message` in `inbox_messages` (`ON CONFLICT DO NOTHING`), inside
    /// `tx`, and when it was not there yet queues it for the [`crate::InboxProcessor`] in the
    /// same transaction. Returns whether it was recorded now (`false`: a redelivery, absorbed).
    pub async fn ingest<T: InboxTx>(&self, tx: &mut T, message: &InboxMessage) -> Result<bool> {
        let flags = tx
            .ingest_messages(&self.schema, std::slice::from_ref(message))
            .await?;
        Ok(flags.first().copied().unwrap_or(false))
    }

    /// [`Inbox::ingest`] for a batch, in one statement and in order (messages of one key are
    /// processed in the order given). Returns, per message, whether it was recorded now; an id
    /// repeated within the batch is recorded once.
    pub async fn ingest_many<T: InboxTx>(
        &self,
        tx: &mut T,
        messages: &[InboxMessage],
    ) -> Result<Vec<bool>> {
        tx.ingest_messages(&self.schema, messages).await
    }

    /// **Request idempotency keys.** Runs `request` once per `key`, inside `tx`, and stores its
    /// result and the ids of the events it enqueued (the [`Response::events`], which this
    /// function enqueues into the outbox, in `tx`). See [`crate::idempotency`].
    pub async fn idempotent<T, R, E, F>(
        &self,
        tx: &mut T,
        key: &str,
        fingerprint: &str,
        request: F,
    ) -> std::result::Result<Idempotent<R>, IdempotencyError<E>>
    where
        T: InboxTx,
        R: serde::Serialize + serde::de::DeserializeOwned,
        F: for<'a> FnOnce(
            &'a mut T,
        )
            -> futures::future::BoxFuture<'a, std::result::Result<Response<R>, E>>,
    {
        idempotency::run(&self.schema, tx, key, fingerprint, request).await
    }
}

/// [`Inbox::claim`] on the default tables (`public` on PostgreSQL).
pub async fn claim<T: InboxTx>(tx: &mut T, consumer: &str, message_id: Uuid) -> Result<bool> {
    Inbox::default().claim(tx, consumer, message_id).await
}

/// [`Inbox::ingest`] on the default tables (`public` and its queue `public_inbox` on
/// PostgreSQL).
pub async fn ingest<T: InboxTx>(tx: &mut T, message: &InboxMessage) -> Result<bool> {
    Inbox::default().ingest(tx, message).await
}

/// [`Inbox::idempotent`] on the default tables (`public` on PostgreSQL).
pub async fn idempotent<T, R, E, F>(
    tx: &mut T,
    key: &str,
    fingerprint: &str,
    request: F,
) -> std::result::Result<Idempotent<R>, IdempotencyError<E>>
where
    T: InboxTx,
    R: serde::Serialize + serde::de::DeserializeOwned,
    F: for<'a> FnOnce(
        &'a mut T,
    ) -> futures::future::BoxFuture<'a, std::result::Result<Response<R>, E>>,
{
    Inbox::default()
        .idempotent(tx, key, fingerprint, request)
        .await
}
