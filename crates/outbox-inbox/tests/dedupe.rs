//! Layer 1, the dedupe claim, on real PostgreSQL and SQLite: a message delivered three times
//! has its effect once; two consumers racing on one message produce one effect; a crash after
//! the commit and before the broker's acknowledgement is absorbed when the broker delivers the
//! message again (NATS JetStream, a real redelivery).

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use common::{Lite, Pg};
use futures::StreamExt;
use outbox_inbox::Inbox;
use sqlx::{Postgres, Sqlite, Transaction};
use uuid::Uuid;

/// One delivery to the consumer `billing`: claim, and apply the effect if the claim is new.
async fn deliver_pg(pg: &Pg, id: Uuid) -> bool {
    let inbox = Inbox::new(pg.schema.clone());
    let mut tx = pg.pool.begin().await.unwrap();
    let fresh = inbox.claim(&mut tx, "billing", id).await.unwrap();
    if fresh {
        effect_pg(pg, &mut tx, id).await;
    }
    tx.commit().await.unwrap();
    fresh
}

async fn effect_pg(pg: &Pg, tx: &mut Transaction<'static, Postgres>, id: Uuid) {
    sqlx::query(&format!(
        "INSERT INTO {}.effects (message_id, key, value) VALUES ($1, 'k', 1)",
        pg.name
    ))
    .bind(id)
    .execute(&mut **tx)
    .await
    .unwrap();
}

async fn deliver_lite(lite: &Lite, id: Uuid) -> bool {
    let mut tx = lite.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let fresh = outbox_inbox::claim(&mut tx, "billing", id).await.unwrap();
    if fresh {
        effect_lite(&mut tx, id).await;
    }
    tx.commit().await.unwrap();
    fresh
}

async fn effect_lite(tx: &mut Transaction<'static, Sqlite>, id: Uuid) {
    sqlx::query("INSERT INTO effects (message_id, key, value) VALUES (?1, 'k', 1)")
        .bind(id.to_string())
        .execute(&mut **tx)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_message_delivered_three_times_has_its_effect_once_on_postgres() {
    let pg = Pg::new().await;
    let id = Uuid::now_v7();
    let claims: Vec<bool> = [
        deliver_pg(&pg, id).await,
        deliver_pg(&pg, id).await,
        deliver_pg(&pg, id).await,
    ]
    .into();
    assert_eq!(claims, vec![true, false, false]);
    assert_eq!(pg.effects().await.len(), 1);
    // Another consumer has its own claim on the same message.
    let inbox = Inbox::new(pg.schema.clone());
    let mut tx = pg.pool.begin().await.unwrap();
    assert!(inbox.claim(&mut tx, "shipping", id).await.unwrap());
    tx.commit().await.unwrap();
    pg.drop_all().await;
}

#[tokio::test]
async fn a_message_delivered_three_times_has_its_effect_once_on_sqlite() {
    let lite = Lite::new().await;
    let id = Uuid::now_v7();
    let claims = vec![
        deliver_lite(&lite, id).await,
        deliver_lite(&lite, id).await,
        deliver_lite(&lite, id).await,
    ];
    assert_eq!(claims, vec![true, false, false]);
    assert_eq!(lite.effects().await.len(), 1);
    lite.drop_all().await;
}

/// Consumer A claims and holds its transaction open; consumer B claims the same message
/// meanwhile and must wait on the primary key, then see A's commit: one effect. When A rolls
/// back instead, B's claim succeeds: still one effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_racing_on_one_message_produce_one_effect_on_postgres() {
    let pg = std::sync::Arc::new(Pg::new().await);
    for a_commits in [true, false] {
        let id = Uuid::now_v7();
        let inbox = Inbox::new(pg.schema.clone());
        let mut a = pg.pool.begin().await.unwrap();
        assert!(inbox.claim(&mut a, "billing", id).await.unwrap());
        effect_pg(&pg, &mut a, id).await;
        let b = {
            let (pg, inbox) = (pg.clone(), inbox.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let mut tx = pg.pool.begin().await.unwrap();
                let fresh = inbox.claim(&mut tx, "billing", id).await.unwrap();
                let waited = started.elapsed();
                if fresh {
                    effect_pg(&pg, &mut tx, id).await;
                }
                tx.commit().await.unwrap();
                (fresh, waited)
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        if a_commits {
            a.commit().await.unwrap();
        } else {
            a.rollback().await.unwrap();
        }
        let (b_fresh, waited) = b.await.unwrap();
        assert!(
            waited >= Duration::from_millis(250),
            "B did not wait for A: {waited:?}"
        );
        assert_eq!(b_fresh, !a_commits);
        let n = pg
            .scalar(&format!(
                "SELECT count(*) FROM {{schema}}.effects WHERE message_id = '{id}'"
            ))
            .await;
        assert_eq!(n, 1, "A commits: {a_commits}");
    }
    std::sync::Arc::try_unwrap(pg)
        .ok()
        .unwrap()
        .drop_all()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_racing_on_one_message_produce_one_effect_on_sqlite() {
    let lite = std::sync::Arc::new(Lite::new().await);
    let id = Uuid::now_v7();
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let lite = lite.clone();
            tokio::spawn(async move {
                let mut tx = lite.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
                let fresh = outbox_inbox::claim(&mut tx, "billing", id).await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
                if fresh {
                    effect_lite(&mut tx, id).await;
                }
                tx.commit().await.unwrap();
                fresh
            })
        })
        .collect();
    let mut fresh = Vec::new();
    for r in runs {
        fresh.push(r.await.unwrap());
    }
    fresh.sort();
    assert_eq!(fresh, vec![false, true]);
    assert_eq!(lite.effects().await.len(), 1);
    std::sync::Arc::try_unwrap(lite)
        .ok()
        .unwrap()
        .drop_all()
        .await;
}

/// A consumer of a JetStream durable consumer (ack wait 1 s) commits the effect and dies
/// before acknowledging. The broker delivers the message again to the next consumer, whose
/// claim says it was processed: it acknowledges without applying anything.
async fn crash_after_commit_before_ack(
    apply: impl Fn(Uuid) -> futures::future::BoxFuture<'static, bool>,
) -> Vec<bool> {
    let client = async_nats::connect(common::nats_url()).await.unwrap();
    let js = jetstream::new(client);
    let name = outbox_testkit::unique_name("dedupe");
    let stream = name.to_uppercase();
    outbox_sinks::nats::create_stream(&js, &stream, vec![format!("{name}.>")], false)
        .await
        .unwrap();
    let id = Uuid::now_v7();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("outbox-message-id", id.to_string().as_str());
    js.publish_with_headers(format!("{name}.paid"), headers, "{}".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let c: consumer::PullConsumer = js
        .get_stream(&stream)
        .await
        .unwrap()
        .create_consumer(consumer::pull::Config {
            durable_name: Some("billing".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(1),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut claims = Vec::new();
    for crash in [true, false] {
        let mut batch = c
            .batch()
            .max_messages(1)
            .expires(Duration::from_secs(5))
            .messages()
            .await
            .unwrap();
        let m = batch.next().await.unwrap().unwrap();
        let got: Uuid = m
            .headers
            .as_ref()
            .unwrap()
            .get("outbox-message-id")
            .unwrap()
            .as_str()
            .parse()
            .unwrap();
        assert_eq!(got, id);
        claims.push(apply(got).await);
        if !crash {
            m.double_ack().await.unwrap();
        }
        // The crashed consumer never acknowledges: the broker delivers it again after 1 s.
    }
    let info = js
        .get_stream(&stream)
        .await
        .unwrap()
        .consumer_info("billing")
        .await
        .unwrap();
    assert_eq!(info.num_ack_pending, 0);
    assert!(info.num_redelivered >= 1 || info.delivered.consumer_sequence >= 2);
    js.delete_stream(&stream).await.unwrap();
    claims
}

#[tokio::test]
async fn a_crash_after_the_commit_and_before_the_ack_is_absorbed_on_postgres() {
    let pg = std::sync::Arc::new(Pg::new().await);
    let p = pg.clone();
    let claims = crash_after_commit_before_ack(move |id| {
        let p = p.clone();
        Box::pin(async move { deliver_pg(&p, id).await })
    })
    .await;
    assert_eq!(claims, vec![true, false]);
    assert_eq!(pg.effects().await.len(), 1);
    std::sync::Arc::try_unwrap(pg)
        .ok()
        .unwrap()
        .drop_all()
        .await;
}

#[tokio::test]
async fn a_crash_after_the_commit_and_before_the_ack_is_absorbed_on_sqlite() {
    let lite = std::sync::Arc::new(Lite::new().await);
    let l = lite.clone();
    let claims = crash_after_commit_before_ack(move |id| {
        let l = l.clone();
        Box::pin(async move { deliver_lite(&l, id).await })
    })
    .await;
    assert_eq!(claims, vec![true, false]);
    assert_eq!(lite.effects().await.len(), 1);
    std::sync::Arc::try_unwrap(lite)
        .ok()
        .unwrap()
        .drop_all()
        .await;
}
