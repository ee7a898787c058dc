//! One publish call as SQS/SNS batch calls: ten entries and one size limit each, many calls
//! in flight, and a refused batch resent one message per call so only the culprit fails.

use std::future::Future;

use futures::stream::{self, StreamExt};
use outbox_core::{Envelope, SinkError};

use super::attributes;
use super::error::Class;

/// Most entries in one `SendMessageBatch` or `PublishBatch` call.
pub(crate) const MAX_ENTRIES: usize = 10;

/// Batch calls one publish call keeps in flight at once.
pub(crate) const MAX_CALLS_IN_FLIGHT: usize = 32;

/// Batch calls a whole sink keeps in flight at once, across every publish call of the relay
/// process (its workers, and the several calls each keeps out): what two workers of one call
/// each kept before, without opening hundreds of connections to the service.
pub(crate) const MAX_CALLS_IN_FLIGHT_PER_SINK: usize = 64;

/// The slots of [`MAX_CALLS_IN_FLIGHT_PER_SINK`], one set per sink.
pub(crate) fn call_slots() -> tokio::sync::Semaphore {
    tokio::sync::Semaphore::new(MAX_CALLS_IN_FLIGHT_PER_SINK)
}

/// Splits `items` (an index and a size in bytes each, in publish order) into consecutive
/// chunks of at most [`MAX_ENTRIES`] items whose sizes add up to at most `max_bytes`. Every
/// item must be at most `max_bytes` itself (the sinks refuse larger messages before this).
pub(crate) fn chunks(items: &[(usize, usize)], max_bytes: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut current: Vec<usize> = Vec::with_capacity(MAX_ENTRIES);
    let mut bytes = 0usize;
    for &(index, size) in items {
        if !current.is_empty() && (current.len() == MAX_ENTRIES || bytes + size > max_bytes) {
            out.push(std::mem::take(&mut current));
            bytes = 0;
        }
        current.push(index);
        bytes += size;
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// One message ready for a batch call.
#[derive(Debug)]
pub struct Entry<'a> {
    /// Its position in the publish call (the batch entry id, and where its result goes).
    pub index: usize,
    /// The envelope (id and key).
    pub envelope: &'a Envelope,
    /// The body: the payload as text.
    pub body: &'a str,
    /// Its message attributes.
    pub attributes: Vec<(String, String)>,
    /// Its size as the service counts it.
    pub size: usize,
    /// `MessageGroupId` on a FIFO queue or topic.
    pub group: Option<&'a str>,
}

impl<'a> Entry<'a> {
    /// Checks and prepares `e` (at `index` of the publish call) for a queue or topic that is
    /// FIFO or not: attributes from its headers, its body, its size against `max_bytes`, and
    /// on FIFO its key as the group. Anything the service could never take is invalid here,
    /// before a call is made.
    pub(crate) fn prepare(
        service: &str,
        index: usize,
        e: &'a Envelope,
        fifo: bool,
        max_bytes: usize,
    ) -> Result<Self, SinkError> {
        let attributes = attributes::attributes(service, e)?;
        let body = attributes::body(service, e)?;
        let size = attributes::message_size(body, &attributes);
        if size > max_bytes {
            return Err(SinkError::invalid(format!(
                "{service}: the message is {size} bytes with its attributes; the limit is \
                 {max_bytes}"
            )));
        }
        let group = if fifo {
            Some(attributes::group_id(service, e)?)
        } else {
            None
        };
        Ok(Self {
            index,
            envelope: e,
            body,
            attributes,
            size,
            group,
        })
    }

    /// The batch entry id: the message's position in the publish call, unique in any batch.
    pub(crate) fn id(&self) -> String {
        self.index.to_string()
    }
}

/// The positions of `batch`'s envelopes grouped by destination, destinations in order of first
/// appearance and positions in order.
pub(crate) fn by_destination(batch: &[Envelope]) -> Vec<(&str, Vec<usize>)> {
    let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
    let mut at: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, e) in batch.iter().enumerate() {
        let slot = *at.entry(e.destination.as_str()).or_insert_with(|| {
            groups.push((e.destination.as_str(), Vec::new()));
            groups.len() - 1
        });
        groups[slot].1.push(i);
    }
    groups
}

/// Reads the entry index back from a batch answer's entry id.
pub(crate) fn index_of(id: &str) -> Option<usize> {
    id.parse().ok()
}

/// Results of a batch answer: `ok` ids are published, `failed` ones get their error, and an
/// entry the answer does not mention is rejected (the service did not acknowledge it).
pub(crate) fn answer_results<'x>(
    sent: &[&Entry<'_>],
    ok: impl Iterator<Item = &'x str>,
    failed: impl Iterator<Item = (&'x str, SinkError)>,
    service: &str,
) -> Vec<(usize, Result<(), SinkError>)> {
    let mut results: std::collections::HashMap<usize, Result<(), SinkError>> =
        std::collections::HashMap::with_capacity(sent.len());
    for id in ok {
        if let Some(i) = index_of(id) {
            results.insert(i, Ok(()));
        }
    }
    for (id, err) in failed {
        if let Some(i) = index_of(id) {
            results.insert(i, Err(err));
        }
    }
    sent.iter()
        .map(|e| {
            let r = results.remove(&e.index).unwrap_or_else(|| {
                Err(SinkError::rejected(format!(
                    "{service}: the batch answer did not mention this message"
                )))
            });
            (e.index, r)
        })
        .collect()
}

/// The outcome of one batch call.
pub(crate) enum Sent {
    /// The service answered: a result for every entry sent, by index.
    Answered(Vec<(usize, Result<(), SinkError>)>),
    /// The whole call failed: its class, and the error each entry gets.
    Failed(Class, SinkError),
}

/// Sends every chunk through `send` (with its target: a queue or topic) with up to
/// [`MAX_CALLS_IN_FLIGHT`] calls at once, each holding one of the sink's `slots` while it is
/// out, until `deadline`; returns a result for every entry answered by then, by index (the
/// caller gives the others an outage: no answer in time).
///
/// A chunk refused as a whole for its content ([`Class::Content`]: a parameter value, a size)
/// was refused before anything in it was accepted; it is sent again one entry per call, so
/// that only the message at fault fails (invalid) and the others are published.
pub(crate) async fn send_chunks<'e, 'a, T, F, Fut>(
    chunks: Vec<(T, Vec<&'e Entry<'a>>)>,
    send: F,
    slots: &tokio::sync::Semaphore,
    deadline: tokio::time::Instant,
) -> Vec<(usize, Result<(), SinkError>)>
where
    'a: 'e,
    T: Copy,
    F: Fn(T, Vec<&'e Entry<'a>>) -> Fut,
    Fut: Future<Output = Sent>,
{
    // The futures are made by a plain iterator and only then driven as a stream: closures
    // inside stream combinators trip the compiler's `Send` check of the boxed publish future.
    let calls: Vec<_> = chunks
        .into_iter()
        .map(|(target, chunk)| {
            let send = &send;
            async move {
                // Never closed; a chunk still waiting for a slot at the deadline is not sent.
                let _slot = slots.acquire().await;
                send_chunk(send, target, chunk).await
            }
        })
        .collect();
    let mut answers = stream::iter(calls).buffer_unordered(MAX_CALLS_IN_FLIGHT);
    let mut out = Vec::new();
    // Answers are kept as they come, so a deadline passed mid-way loses none of them.
    while let Ok(Some(results)) = tokio::time::timeout_at(deadline, answers.next()).await {
        out.extend(results);
    }
    out
}

/// One chunk through `send`; see [`send_chunks`].
async fn send_chunk<'e, 'a, T, F, Fut>(
    send: &F,
    target: T,
    chunk: Vec<&'e Entry<'a>>,
) -> Vec<(usize, Result<(), SinkError>)>
where
    'a: 'e,
    T: Copy,
    F: Fn(T, Vec<&'e Entry<'a>>) -> Fut,
    Fut: Future<Output = Sent>,
{
    match send(target, chunk.clone()).await {
        Sent::Answered(results) => results,
        Sent::Failed(Class::Content, _) if chunk.len() > 1 => {
            let singles: Vec<_> = chunk.iter().map(|e| send_single(send, target, e)).collect();
            futures::future::join_all(singles)
                .await
                .into_iter()
                .flatten()
                .collect()
        }
        Sent::Failed(_, err) => chunk.iter().map(|e| (e.index, Err(err.clone()))).collect(),
    }
}

/// One entry alone through `send`, to learn whether it is the one a batch was refused for.
async fn send_single<'e, 'a, T, F, Fut>(
    send: &F,
    target: T,
    entry: &'e Entry<'a>,
) -> Vec<(usize, Result<(), SinkError>)>
where
    'a: 'e,
    F: Fn(T, Vec<&'e Entry<'a>>) -> Fut,
    Fut: Future<Output = Sent>,
{
    match send(target, vec![entry]).await {
        Sent::Answered(results) => results,
        Sent::Failed(_, err) => vec![(entry.index, Err(err))],
    }
}

/// The chunks of every target's entries (see [`chunks`]), each with its target.
pub(crate) fn target_chunks<'e, 'a, T: Copy>(
    targets: impl IntoIterator<Item = (T, &'e [Entry<'a>])>,
    max_bytes: usize,
) -> Vec<(T, Vec<&'e Entry<'a>>)> {
    let mut out = Vec::new();
    for (target, entries) in targets {
        let sizes: Vec<(usize, usize)> = entries
            .iter()
            .enumerate()
            .map(|(k, e)| (k, e.size))
            .collect();
        for chunk in chunks(&sizes, max_bytes) {
            out.push((target, chunk.into_iter().map(|k| &entries[k]).collect()));
        }
    }
    out
}

/// Puts each result of `sent` into `results`; every message still without one had no answer
/// within the ack timeout (the call, or the calls queued behind others, did not finish in
/// time): an outage, retried.
pub(crate) fn finish(
    mut results: Vec<Option<Result<(), SinkError>>>,
    sent: Vec<(usize, Result<(), SinkError>)>,
    service: &str,
    ack_timeout: std::time::Duration,
) -> Vec<Result<(), SinkError>> {
    for (i, r) in sent {
        if let Some(slot) = results.get_mut(i) {
            *slot = Some(r);
        }
    }
    results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(SinkError::unavailable(format!(
                    "{service}: no answer within the ack timeout ({} ms)",
                    ack_timeout.as_millis()
                )))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(destination: &str) -> Envelope {
        Envelope {
            id: uuid::Uuid::nil(),
            destination: destination.into(),
            key: "k".into(),
            headers: vec![("outbox-message-id".into(), "x".into())],
            payload: bytes::Bytes::from_static(b"{}"),
            created_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn envelopes_group_by_destination_in_order() {
        let batch: Vec<Envelope> = ["a", "b", "a", "c", "b"]
            .into_iter()
            .map(envelope)
            .collect();
        assert_eq!(
            by_destination(&batch),
            vec![("a", vec![0, 2]), ("b", vec![1, 4]), ("c", vec![3])]
        );
    }

    #[test]
    fn a_partial_answer_fails_only_the_failed_entries() {
        let batch: Vec<Envelope> = (0..3).map(|_| envelope("q")).collect();
        let entries: Vec<Entry<'_>> = batch
            .iter()
            .enumerate()
            .map(|(i, e)| {
                Entry::prepare("sqs", i + 7, e, false, 1024).unwrap_or_else(|e| panic!("{e}"))
            })
            .collect();
        let sent: Vec<&Entry<'_>> = entries.iter().collect();
        let r = answer_results(
            &sent,
            ["7"].into_iter(),
            [("8", SinkError::invalid("bad"))].into_iter(),
            "sqs",
        );
        assert_eq!(r[0], (7, Ok(())));
        assert_eq!(r[1].0, 8);
        assert_eq!(
            r[1].1.as_ref().unwrap_err().kind,
            outbox_core::SinkErrorKind::Invalid
        );
        assert_eq!(r[2].0, 9);
        assert_eq!(
            r[2].1.as_ref().unwrap_err().kind,
            outbox_core::SinkErrorKind::Rejected
        );
    }

    #[test]
    fn oversized_messages_are_invalid_before_any_call() {
        let mut e = envelope("q");
        e.payload = bytes::Bytes::from(vec![b'1'; 2000]);
        let err = Entry::prepare("sqs", 0, &e, false, 1024).unwrap_err();
        assert_eq!(err.kind, outbox_core::SinkErrorKind::Invalid);
        assert!(err.message.contains("limit is 1024"), "{}", err.message);
    }

    fn prepared(batch: &[Envelope]) -> Vec<Entry<'_>> {
        batch
            .iter()
            .enumerate()
            .map(|(i, e)| {
                Entry::prepare("sqs", i, e, false, 1024).unwrap_or_else(|e| panic!("{e}"))
            })
            .collect()
    }

    #[tokio::test]
    async fn a_batch_refused_for_its_content_is_resent_one_by_one_and_only_the_culprit_fails() {
        let batch: Vec<Envelope> = (0..12).map(|_| envelope("q")).collect();
        let entries = prepared(&batch);
        let calls = target_chunks([((), entries.as_slice())], 1024);
        assert_eq!(calls.len(), 2, "12 entries: a chunk of ten and one of two");
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        let sent = send_chunks(
            calls,
            |(), chunk: Vec<&Entry<'_>>| async move {
                if chunk.iter().any(|e| e.index == 3) {
                    if chunk.len() > 1 {
                        return Sent::Failed(Class::Content, SinkError::invalid("whole batch"));
                    }
                    return Sent::Failed(Class::Content, SinkError::invalid("message 3"));
                }
                Sent::Answered(chunk.iter().map(|e| (e.index, Ok(()))).collect())
            },
            &call_slots(),
            deadline,
        )
        .await;
        let results = finish(
            vec![None; batch.len()],
            sent,
            "sqs",
            std::time::Duration::ZERO,
        );
        for (i, r) in results.iter().enumerate() {
            match i {
                3 => assert_eq!(r.as_ref().unwrap_err().message, "message 3"),
                _ => assert!(r.is_ok(), "{i}: {r:?}"),
            }
        }
    }

    /// The sink's slots bound its batch calls across publish calls: two calls of five chunks
    /// each, sharing two slots, never have more than two batch calls out.
    #[tokio::test]
    async fn publish_calls_in_flight_together_share_the_sinks_slots() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let batch: Vec<Envelope> = (0..50).map(|_| envelope("q")).collect();
        let entries = prepared(&batch);
        let (out, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let slots = tokio::sync::Semaphore::new(2);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        async fn counted(out: &AtomicUsize, most: &AtomicUsize, chunk: Vec<&Entry<'_>>) -> Sent {
            most.fetch_max(out.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            out.fetch_sub(1, Ordering::SeqCst);
            Sent::Answered(chunk.iter().map(|e| (e.index, Ok(()))).collect())
        }
        let (a, b) = entries.split_at(25);
        let (sa, sb) = tokio::join!(
            send_chunks(
                target_chunks([((), a)], 1024),
                |(), chunk: Vec<&Entry<'_>>| counted(&out, &most, chunk),
                &slots,
                deadline
            ),
            send_chunks(
                target_chunks([((), b)], 1024),
                |(), chunk: Vec<&Entry<'_>>| counted(&out, &most, chunk),
                &slots,
                deadline
            ),
        );
        assert_eq!(sa.len() + sb.len(), 50, "every entry answered");
        assert_eq!(most.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_refusal_of_another_class_fails_the_whole_batch_without_resending() {
        let batch: Vec<Envelope> = (0..3).map(|_| envelope("q")).collect();
        let entries = prepared(&batch);
        let calls = target_chunks([((), entries.as_slice())], 1024);
        let count = std::sync::atomic::AtomicUsize::new(0);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        let sent = send_chunks(
            calls,
            |(), _chunk: Vec<&Entry<'_>>| {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { Sent::Failed(Class::Missing, SinkError::rejected("no queue `q`")) }
            },
            &call_slots(),
            deadline,
        )
        .await;
        assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 1);
        let results = finish(
            vec![None; batch.len()],
            sent,
            "sqs",
            std::time::Duration::ZERO,
        );
        assert!(results
            .iter()
            .all(|r| r.as_ref().unwrap_err().kind == outbox_core::SinkErrorKind::Rejected));
    }

    #[tokio::test]
    async fn calls_without_an_answer_by_the_deadline_are_unavailable_and_answers_are_kept() {
        let batch: Vec<Envelope> = (0..20).map(|_| envelope("q")).collect();
        let entries = prepared(&batch);
        let calls = target_chunks([((), entries.as_slice())], 1024);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(200);
        let sent = send_chunks(
            calls,
            |(), chunk: Vec<&Entry<'_>>| async move {
                // The second chunk never answers in time.
                if chunk[0].index >= 10 {
                    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                }
                Sent::Answered(chunk.iter().map(|e| (e.index, Ok(()))).collect())
            },
            &call_slots(),
            deadline,
        )
        .await;
        let results = finish(
            vec![None; batch.len()],
            sent,
            "sqs",
            std::time::Duration::from_millis(200),
        );
        assert!(results[..10].iter().all(Result::is_ok));
        assert!(results[10..]
            .iter()
            .all(|r| r.as_ref().unwrap_err().kind == outbox_core::SinkErrorKind::Unavailable));
    }

    #[test]
    fn chunks_hold_at_most_ten_entries_and_the_size_limit() {
        let items: Vec<(usize, usize)> = (0..25).map(|i| (i, 10)).collect();
        let c = chunks(&items, 1000);
        assert_eq!(c.iter().map(Vec::len).collect::<Vec<_>>(), vec![10, 10, 5]);
        assert_eq!(c.concat(), (0..25).collect::<Vec<_>>());

        // 100 + 100 + 100 > 250: a new chunk before the third.
        let c = chunks(&[(0, 100), (1, 100), (2, 100), (3, 250), (4, 1)], 250);
        assert_eq!(c, vec![vec![0, 1], vec![2], vec![3], vec![4]]);
        assert!(chunks(&[], 10).is_empty());
    }
}
