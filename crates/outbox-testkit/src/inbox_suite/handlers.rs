//! Inbox backend cases about ingest and the processor: each message recorded once and handled
//! once in key order, transient and permanent handler failures, redrive, and messages without a
//! handler.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::RedriveScope;
use outbox_inbox::{Handlers, InboxMessage, ProcessorConfig};
use uuid::Uuid;

use super::{
    assert_once_in_order, effects, ingest, messages, processor_config, spawn, spawn_processor,
    state, wait_effects, wait_for, InboxBackend, Script, EFFECT, WAIT,
};

/// Ingest records a message once, also when it is delivered again or repeated within a batch,
/// and queues it once, with its source, type and key; the processor then applies every
/// message once, each key in order, and marks all processed.
pub async fn ingest_records_each_message_once_and_handlers_apply_it_once_in_key_order<
    B: InboxBackend,
>(
    b: Arc<B>,
) {
    let msgs = messages(10, 30);
    let mut first = msgs.clone();
    first.push(msgs[0].clone());
    let flags = ingest(b.as_ref(), &first).await;
    assert_eq!(flags.iter().filter(|f| **f).count(), msgs.len());
    assert!(!flags[msgs.len()], "a repeat inside the batch");
    assert!(
        ingest(b.as_ref(), &msgs).await.iter().all(|f| !f),
        "delivered again: nothing recorded"
    );
    let n = msgs.len() as i64;
    assert_eq!(
        b.scalar("SELECT count(*) FROM {schema}.inbox_messages")
            .await,
        n
    );
    assert_eq!(b.scalar("SELECT count(*) FROM {queue}").await, n);
    let m = &msgs[5];
    let row = b
        .texts(&format!(
            "SELECT source, type, key FROM {{schema}}.inbox_messages \
             WHERE CAST(id AS TEXT) = '{}'",
            m.id
        ))
        .await;
    assert_eq!(
        row[0],
        vec![
            Some("test".to_string()),
            Some("order.paid".to_string()),
            Some(m.key.clone())
        ]
    );
    let script = Arc::new(Script::default());
    let (stop, task) = spawn_processor(b.as_ref(), &script, processor_config());
    let got = wait_effects(b.as_ref(), msgs.len()).await;
    stop.cancel();
    task.await.unwrap();
    assert_once_in_order(&got, &msgs);
    assert_eq!(
        b.scalar("SELECT count(*) FROM {schema}.inbox_message_states WHERE state = 'processed'")
            .await,
        n
    );
}

/// The same with one transaction per message (no savepoints) and with one group per batch, a
/// message of the first wave failing once (undone alone; its key waits for it): the result
/// does not depend on how messages are grouped into transactions.
pub async fn handlers_apply_each_message_once_in_key_order_whatever_the_grouping<
    B: InboxBackend,
>(
    b: Arc<B>,
) {
    let mut done = 0;
    for per_tx in [1, 1000] {
        let msgs = messages(7, 20);
        ingest(b.as_ref(), &msgs).await;
        let script = Arc::new(Script::default());
        script.transient.lock().unwrap().insert(msgs[3].id, 1);
        let cfg = ProcessorConfig {
            messages_per_transaction: per_tx,
            ..processor_config()
        };
        let (stop, task) = spawn_processor(b.as_ref(), &script, cfg);
        let got = wait_effects(b.as_ref(), done + msgs.len()).await;
        stop.cancel();
        task.await.unwrap();
        assert_once_in_order(&got[done..], &msgs);
        done += msgs.len();
    }
}

/// A handler that fails transiently three times on the head of a key succeeds later; its key
/// waits for it, every message is applied once in key order, and the handler ran three times
/// more than there are messages.
pub async fn a_handler_that_fails_transiently_succeeds_later_and_its_key_waits_for_it<
    B: InboxBackend,
>(
    b: Arc<B>,
) {
    let msgs = messages(3, 5);
    let flaky = msgs[0].id; // key-0, value 0: the head of its key
    let script = Arc::new(Script::default());
    script.transient.lock().unwrap().insert(flaky, 3);
    ingest(b.as_ref(), &msgs).await;
    let (stop, task) = spawn_processor(b.as_ref(), &script, processor_config());
    let got = wait_effects(b.as_ref(), msgs.len()).await;
    stop.cancel();
    task.await.unwrap();
    assert_once_in_order(&got, &msgs);
    assert_eq!(state(b.as_ref(), flaky).await.0, "processed");
    assert_eq!(script.calls.load(Ordering::SeqCst) as usize, msgs.len() + 3);
}

/// A handler that fails permanently ends the message `failed` at its first attempt, with its
/// error, listed by the queue's `failed`; its key waits behind it while the other keys flow.
/// Redriven once the handler is fixed, it is handled and its key drains in order.
pub async fn a_handler_that_fails_permanently_ends_failed_with_its_error_and_can_be_redriven<
    B: InboxBackend,
>(
    b: Arc<B>,
) {
    let msgs = messages(3, 4);
    ingest(b.as_ref(), &msgs).await;
    let poison = msgs[3].id; // key-0, value 1: key-0 has more behind it
    let script = Arc::new(Script::default());
    script.poison.lock().unwrap().push(poison);
    script.broken.store(true, Ordering::SeqCst);
    let (stop, task) = spawn_processor(b.as_ref(), &script, processor_config());
    let others = msgs.len() - 3; // key-0 values 1, 2, 3 wait
    wait_effects(b.as_ref(), others).await;
    wait_for(WAIT, "the poison message failed", || async {
        state(b.as_ref(), poison).await.0 == "failed"
    })
    .await;
    let (_, error) = state(b.as_ref(), poison).await;
    assert!(
        error.unwrap_or_default().contains("amount is negative"),
        "the handler's error is kept"
    );
    let queue = b.queue();
    let failed = queue.failed(10).await.unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].id, poison);
    assert_eq!(failed[0].attempts, 1, "a permanent failure is not retried");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        effects(b.as_ref()).await.len(),
        others,
        "its key waits behind it"
    );
    // The fix ships; an operator redrives it (`outbox redrive --inbox --id …`).
    script.broken.store(false, Ordering::SeqCst);
    let redriven = queue
        .redrive(&RedriveScope::Ids(vec![poison]), "handler fixed")
        .await
        .unwrap();
    assert_eq!(redriven, 1);
    let got = wait_effects(b.as_ref(), msgs.len()).await;
    stop.cancel();
    task.await.unwrap();
    assert_once_in_order(&got, &msgs);
    assert_eq!(state(b.as_ref(), poison).await.0, "processed");
}

/// The processor died after a handler's transaction committed and before it recorded the
/// message as handled (its claim exists): the message is handed out again, the claim says it
/// was processed, and the handler is not run for it.
pub async fn a_message_whose_handler_already_committed_is_not_handled_again<B: InboxBackend>(
    b: Arc<B>,
) {
    let msgs = messages(2, 3);
    ingest(b.as_ref(), &msgs).await;
    let done = msgs[2].id;
    let mut tx = b.begin().await;
    assert!(b
        .inbox()
        .claim(&mut tx, outbox_inbox::PROCESSOR_CONSUMER, done)
        .await
        .unwrap());
    B::finish(tx, true).await;
    let script = Arc::new(Script::default());
    let (stop, task) = spawn_processor(b.as_ref(), &script, processor_config());
    let queue = b.queue();
    wait_for(WAIT, "the queue drained", || async {
        queue.stats().await.unwrap().pending == 0
    })
    .await;
    stop.cancel();
    task.await.unwrap();
    let got = effects(b.as_ref()).await;
    assert_eq!(got.len(), msgs.len() - 1);
    assert!(got.iter().all(|(id, _, _)| *id != done));
    assert_eq!(script.calls.load(Ordering::SeqCst) as usize, msgs.len() - 1);
}

/// A message whose type has no handler ends `failed` at once with an error naming the type,
/// while a closure registered for the other type handles its message.
pub async fn a_message_without_a_handler_fails_visibly_and_a_closure_can_handle_the_rest<
    B: InboxBackend,
>(
    b: Arc<B>,
) {
    let message = |ty: &str, key: &str| {
        InboxMessage::new(Uuid::now_v7(), "test", ty, key, serde_json::json!({}))
    };
    let (known, unknown) = (message("order.paid", "a"), message("order.refunded", "b"));
    ingest(b.as_ref(), &[known.clone(), unknown.clone()]).await;
    let insert = b.sql(EFFECT);
    let handlers = Handlers::<B::Db>::new().on_fn("order.paid", move |tx, m| {
        let insert = insert.clone();
        Box::pin(async move {
            B::execute(
                B::tx(tx),
                &insert,
                &[m.id.into(), m.key.clone().into(), 1.into()],
            )
            .await?;
            Ok(())
        })
    });
    let (stop, task) = spawn(b.processor(handlers, processor_config()));
    let queue = b.queue();
    wait_for(WAIT, "one handled, one failed", || async {
        let s = queue.stats().await.unwrap();
        s.failed == 1 && s.pending == 0
    })
    .await;
    stop.cancel();
    task.await.unwrap();
    assert_eq!(effects(b.as_ref()).await.len(), 1);
    let failed = queue.failed(10).await.unwrap();
    assert_eq!(failed[0].id, unknown.id);
    let error = failed[0].last_error.clone().unwrap_or_default();
    assert!(
        error.contains("no handler for message type `order.refunded`"),
        "{error}"
    );
}
