//! The Debezium drop-in on real PostgreSQL and Kafka (tansu): an application writes Debezium's
//! documented outbox table with its INSERTs unchanged (some rows deleted right after, as
//! Debezium advises); `outbox migrate --adopt-debezium` copies them into the relay's table; a
//! relay with `envelope=debezium` publishes; a consumer written to the Event Router's
//! documented output (topic `outbox.event.<aggregatetype>`, key = aggregate id, `id` header,
//! payload value) reads every event, once each as far as it can tell, in per-key order.

#![allow(clippy::unwrap_used)]

use crate::common;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::World;
use outbox_core::{Formatted, RouteSpec, Sink};
use outbox_postgres::debezium::{adopt, release, TableName};
use outbox_sinks::kafka::{create_topic, delete_topic, KafkaConfig, KafkaReader};
use outbox_sinks::read::Reader;
use outbox_testkit::relay::{read_distinct, RunningRelay};

fn kafka_url() -> String {
    std::env::var("OUTBOX_TEST_KAFKA_URL").unwrap_or_else(|_| "kafka://127.0.0.1:9092".into())
}

const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// Debezium's documented table, with the optional tracing column and one additional column.
const DEBEZIUM_TABLE: &str = "CREATE TABLE {app}.outbox (
    id uuid NOT NULL PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) NOT NULL,
    type varchar(255) NOT NULL,
    payload jsonb,
    tracingspancontext varchar(256),
    tenant varchar(64)
)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debezium_app_and_an_event_router_consumer_work_unchanged_through_the_relay() {
    let w = World::with_stream(false).await;
    let app = format!("{}_app", w.schema.as_str());
    let aggregate = format!("order{}", &w.schema.as_str()[w.schema.as_str().len() - 6..]);
    sqlx::raw_sql(&format!(
        "CREATE SCHEMA {app}; {}",
        DEBEZIUM_TABLE.replace("{app}", &app)
    ))
    .execute(&w.pool)
    .await
    .unwrap();
    let table = TableName::parse(&format!("{app}.outbox")).unwrap();
    let adopted = adopt(&w.pool, &w.schema, &table).await.unwrap();
    assert!(adopted.tracing);
    assert_eq!(adopted.additional, vec!["tenant".to_string()]);
    // Adopting twice is harmless.
    adopt(&w.pool, &w.schema, &table).await.unwrap();

    // The application's INSERTs, as Debezium documents them; every other transaction deletes
    // its row right after inserting it.
    let keys = ["o-1", "o-2", "o-3"];
    let mut written: Vec<(uuid::Uuid, String, i64)> = Vec::new();
    for n in 0..4i64 {
        for (k, key) in keys.iter().enumerate() {
            let id = uuid::Uuid::now_v7();
            let mut tx = w.pool.begin().await.unwrap();
            sqlx::query(&format!(
                "INSERT INTO {app}.outbox (id, aggregatetype, aggregateid, type, payload, \
                 tracingspancontext, tenant) VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7)"
            ))
            .bind(id)
            .bind(&aggregate)
            .bind(*key)
            .bind("OrderCreated")
            .bind(serde_json::json!({"n": n, "key": key}).to_string())
            .bind(format!(
                "#Sat Dec 06\ntraceparent={TRACEPARENT}\ntracestate=v=1\n"
            ))
            .bind("t9")
            .execute(&mut *tx)
            .await
            .unwrap();
            if (n as usize + k).is_multiple_of(2) {
                sqlx::query(&format!("DELETE FROM {app}.outbox WHERE id = $1"))
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
            }
            tx.commit().await.unwrap();
            written.push((id, key.to_string(), n));
        }
    }
    // A rolled-back INSERT is not copied.
    let mut tx = w.pool.begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {app}.outbox (id, aggregatetype, aggregateid, type, payload) \
         VALUES ($1, $2, 'o-1', 'OrderCreated', '{{}}')"
    ))
    .bind(uuid::Uuid::now_v7())
    .bind(&aggregate)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();

    // The consumer reads the Event Router's default topic.
    let topic = format!("outbox.event.{aggregate}");
    let brokers = KafkaConfig::from_url(&kafka_url()).unwrap().brokers;
    create_topic(&brokers, &topic, 4).await.unwrap();
    let mut reader = KafkaReader::open(&brokers, &topic).await.unwrap();

    let route = RouteSpec::parse(
        &format!(
            "sink={}; envelope=debezium; table.expand.json.payload=true; \
             table.fields.additional.placement=type:header:eventType,tenant:header",
            kafka_url()
        ),
        1,
    )
    .unwrap();
    let sink = outbox_sinks::connect(&route.sink).await.unwrap();
    let sink: Arc<dyn Sink> = Arc::new(Formatted::new(sink, route.envelope.clone()));
    let mut cfg = w.relay_config();
    cfg.destination = route.destination.clone().unwrap();
    let relay = RunningRelay::start(w.dyn_store(), sink, cfg);
    w.wait_drained(Duration::from_secs(30)).await;
    relay.stop().await;
    let got = read_distinct(&mut reader, written.len(), Duration::from_secs(30)).await;

    // What an Event Router consumer reads: the `id` header, the key, the payload.
    let mut last: HashMap<String, i64> = HashMap::new();
    let mut seen = std::collections::HashSet::new();
    for d in &got {
        let id: uuid::Uuid = d.header("id").expect("the `id` header").parse().unwrap();
        let (_, key, n) = written.iter().find(|(i, _, _)| *i == id).unwrap();
        assert_eq!(&d.key, key, "the record key is the aggregate id");
        assert_eq!(d.destination, topic);
        let value: serde_json::Value = serde_json::from_slice(&d.payload).unwrap();
        assert_eq!(value, serde_json::json!({"n": n, "key": key}));
        assert_eq!(d.header("eventType"), Some("OrderCreated"));
        assert_eq!(d.header("tenant"), Some("t9"));
        assert_eq!(d.header("traceparent"), Some(TRACEPARENT));
        assert_eq!(d.header("tracestate"), Some("v=1"));
        if seen.insert(id) {
            let prev = last.insert(key.clone(), *n);
            assert!(prev.is_none_or(|p| p < *n), "{key}: {prev:?} then {n}");
        }
    }
    assert_eq!(
        seen.len(),
        written.len(),
        "every event, the rolled-back one not"
    );

    release(&w.pool, &w.schema, &table).await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {app}.outbox (id, aggregatetype, aggregateid, type, payload) \
         VALUES ($1, $2, 'o-1', 'OrderCreated', '{{}}')"
    ))
    .bind(uuid::Uuid::now_v7())
    .bind(&aggregate)
    .execute(&w.pool)
    .await
    .unwrap();
    assert_eq!(
        w.stats().await.pending,
        0,
        "released: INSERTs are no longer copied"
    );

    reader.cleanup().await;
    let _ = delete_topic(&brokers, &topic).await;
    sqlx::raw_sql(&format!("DROP SCHEMA {app} CASCADE"))
        .execute(&w.pool)
        .await
        .unwrap();
    w.drop_all().await;
}

#[tokio::test]
async fn adopting_refuses_what_is_not_debeziums_layout() {
    let w = World::with_stream(false).await;
    let app = format!("{}_bad", w.schema.as_str());
    sqlx::raw_sql(&format!(
        "CREATE SCHEMA {app}; CREATE TABLE {app}.events (id uuid, aggregatetype text, type text, payload jsonb);
         CREATE TABLE {app}.binary_outbox (id uuid, aggregatetype text, aggregateid text, type text, payload bytea);"
    ))
    .execute(&w.pool)
    .await
    .unwrap();
    for (t, says) in [
        ("events", "no `aggregateid` column"),
        ("binary_outbox", "bytea"),
        ("missing", "does not exist"),
    ] {
        let table = TableName::parse(&format!("{app}.{t}")).unwrap();
        let err = adopt(&w.pool, &w.schema, &table)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(says), "{t}: {err}");
    }
    let own = TableName::parse(&format!("{}.outbox", w.schema.as_str())).unwrap();
    let err = adopt(&w.pool, &w.schema, &own)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("relay's own outbox table"), "{err}");
    sqlx::raw_sql(&format!("DROP SCHEMA {app} CASCADE"))
        .execute(&w.pool)
        .await
        .unwrap();
    w.drop_all().await;
}
