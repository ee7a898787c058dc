//! Retention on MariaDB: ranges of the message table dropped whole, only once no writer can add
//! to them, every position passed them and nothing parked lies in them; each test in a
//! database of its own, with 100-seq ranges so that a few hundred rows span several.

#![allow(clippy::unwrap_used)] // tests

use std::time::Duration;

use outbox_core::{
    ClaimLimits, MemberId, Message, NewMessage, OnFailed, Outcome, RedriveScope, Store,
};
use outbox_mysql::{connect_pool, enqueue, migrate, ranges, MysqlStore, Schema};
use sqlx::{Connection, MySqlConnection};

mod common;
use common::{msg, n_of, server_url};

const KEEP: Duration = Duration::from_secs(3600);
const NOW: Duration = Duration::ZERO;

struct Db {
    store: MysqlStore,
    member: MemberId,
    parts: Vec<i32>,
}

impl Db {
    /// A migrated outbox whose ranges span 100 seqs each: set before the first write, so the
    /// ranges laid ahead are [1, 101) and [101, 201); maintenance drops the empty one below 1.
    async fn start() -> Self {
        let pool = connect_pool(&server_url(), 8).await.unwrap();
        let schema = Schema::new(&outbox_testkit::unique_name("ret")).unwrap();
        migrate(&pool, &schema).await.unwrap();
        assert_eq!(ranges::set_width(&pool, &schema, 100).await.unwrap(), 2);
        let store = MysqlStore::new(pool, schema);
        let m = store.maintain(KEEP).await.unwrap();
        assert_eq!((m.segments_created, m.segments_dropped), (0, 1), "{m:?}");
        let member = MemberId::random("ret");
        let parts = store
            .rebalance(&member, Duration::from_secs(60))
            .await
            .unwrap();
        let db = Self {
            store,
            member,
            parts,
        };
        assert_eq!(db.ranges().await, ["s101", "s201", "s_max"]);
        db
    }

    async fn conn(&self) -> MySqlConnection {
        MySqlConnection::connect(&server_url()).await.unwrap()
    }

    async fn ranges(&self) -> Vec<String> {
        let mut conn = self.conn().await;
        ranges::ranges(&mut conn, self.store.schema())
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect()
    }

    async fn rows(&self) -> i64 {
        sqlx::query_scalar(
            &self
                .store
                .schema()
                .render("SELECT COUNT(*) FROM {schema}.outbox"),
        )
        .fetch_one(self.store.pool())
        .await
        .unwrap()
    }

    async fn passed_below(&self) -> i64 {
        sqlx::query_scalar(
            &self
                .store
                .schema()
                .render("SELECT value FROM {schema}.outbox_settings WHERE name = 'passed_below'"),
        )
        .fetch_one(self.store.pool())
        .await
        .unwrap()
    }

    /// Writes messages `from..to` over ten keys, one transaction each 25.
    async fn write(&self, from: u64, to: u64) {
        let msgs: Vec<NewMessage> = (from..to)
            .map(|n| msg(&format!("k{}", n % 10), n))
            .collect();
        for chunk in msgs.chunks(25) {
            self.store.insert(chunk).await.unwrap();
        }
    }

    async fn claim(&self) -> Vec<Message> {
        self.store
            .claim(
                &self.member,
                &self.parts,
                ClaimLimits::rows(1000),
                OnFailed::Block,
            )
            .await
            .unwrap()
    }

    /// Claims and publishes until nothing is left; returns the payloads' numbers, in order.
    async fn drain(&self) -> Vec<u64> {
        let mut out = Vec::new();
        loop {
            let got = self.claim().await;
            if got.is_empty() {
                return out;
            }
            let outcomes: Vec<_> = got
                .iter()
                .map(|m| Outcome::Published { seq: m.seq })
                .collect();
            self.store.complete(&self.member, &outcomes).await.unwrap();
            out.extend(got.iter().map(n_of));
        }
    }

    async fn drop(self) {
        sqlx::raw_sql(&self.store.schema().render("DROP DATABASE {schema}"))
            .execute(self.store.pool())
            .await
            .unwrap();
    }
}

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v
}

/// A range goes whole once every position passed it and retention ran out; a range with a
/// pending row stays, and so does one retention still keeps. Claims afterwards read only above
/// the ranges every position passed, and lose nothing.
#[tokio::test]
async fn a_range_goes_whole_once_every_position_passed_it_and_pending_rows_stay() {
    let db = Db::start().await;
    db.write(1, 101).await; // seqs 1..=100: the range [1, 101)
    assert_eq!(sorted(db.drain().await), (1..101).collect::<Vec<_>>());
    db.write(101, 151).await; // pending, in [101, 201)
    let kept = db.store.maintain(KEEP).await.unwrap();
    assert_eq!(
        kept.segments_dropped, 0,
        "retention keeps it an hour: {kept:?}"
    );
    assert_eq!(db.rows().await, 150);

    let m = db.store.maintain(NOW).await.unwrap();
    assert_eq!(m.segments_dropped, 1, "{m:?}");
    assert_eq!(db.ranges().await, ["s201", "s301", "s401", "s_max"]);
    assert_eq!(db.rows().await, 50, "only the passed range went");
    assert_eq!(db.passed_below().await, 101);

    db.write(151, 211).await;
    assert_eq!(sorted(db.drain().await), (101..211).collect::<Vec<_>>());
    let m = db.store.maintain(NOW).await.unwrap();
    assert_eq!(m.segments_dropped, 1, "{m:?}");
    assert_eq!(db.passed_below().await, 201);
    assert_eq!(
        db.rows().await,
        10,
        "the rows of [201, 301) stay: the range is still open"
    );
    db.write(211, 231).await;
    assert_eq!(sorted(db.drain().await), (211..231).collect::<Vec<_>>());
    let s = db.store.stats().await.unwrap();
    assert_eq!((s.pending, s.published), (0, 230));
    db.drop().await;
}

/// A failed message is read from its row: its range stays while it is parked, whatever the
/// positions say, and goes once it was redriven and published.
#[tokio::test]
async fn a_parked_message_keeps_its_range_until_it_is_out() {
    let db = Db::start().await;
    db.write(1, 101).await;
    let got = db.claim().await;
    assert_eq!(got.len(), 100);
    // The last message of its key in the batch, so no later one of the key was tried.
    let bad = got.iter().find(|m| n_of(m) == 97).unwrap().seq;
    let outcomes: Vec<_> = got
        .iter()
        .map(|m| {
            if m.seq == bad {
                Outcome::Failed {
                    seq: m.seq,
                    error: "rejected".into(),
                }
            } else {
                Outcome::Published { seq: m.seq }
            }
        })
        .collect();
    db.store.complete(&db.member, &outcomes).await.unwrap();
    db.write(101, 111).await; // the seal moves past the range
    let left: Vec<u64> = db.drain().await;
    assert!(!left.contains(&97) && !left.contains(&107), "{left:?}");
    let m = db.store.maintain(NOW).await.unwrap();
    assert_eq!(m.segments_dropped, 0, "{m:?}");
    assert!(db.ranges().await.contains(&"s101".to_string()));
    assert_eq!(db.store.failed(10).await.unwrap().len(), 1);

    assert_eq!(
        db.store.redrive(&RedriveScope::All, "fixed").await.unwrap(),
        1
    );
    // A redrive is noticed at the next read of the parked heads (at most a second away).
    let mut again = Vec::new();
    for _ in 0..50 {
        again = db.drain().await;
        if !again.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(again, vec![97, 107]);
    let m = db.store.maintain(NOW).await.unwrap();
    assert_eq!(m.segments_dropped, 1, "{m:?}");
    assert!(!db.ranges().await.contains(&"s101".to_string()));
    db.drop().await;
}

/// A writer's transaction in progress holds a row nobody can see yet (seq 99) in a range
/// whose other rows are all passed, while a later writer's row (seq 100) is committed and
/// passed: the range looks finished to any read. Maintenance must not drop it under the
/// writer: it waits for the writer's partition counter, and either the writer commits during
/// that wait (its row is then seen, not passed) or the round is given up. The row is delivered.
async fn a_writer_in_progress_keeps_its_range(commit_during_wait: bool) {
    let db = Db::start().await;
    db.write(1, 99).await; // seqs 1..=98
    assert_eq!(db.drain().await.len(), 98);
    // Ranges ahead now, so the round below needs no DDL (which would wait for the writer's
    // metadata lock instead) and reaches the seal.
    db.store.maintain(KEEP).await.unwrap();
    assert_eq!(db.ranges().await, ["s101", "s201", "s301", "s_max"]);
    let mut writer = db.store.pool().begin().await.unwrap();
    enqueue(&mut writer, db.store.schema(), &msg("slow", 99))
        .await
        .unwrap();
    let other = other_partition_key(&db, "slow").await;
    db.store.insert(&[msg(&other, 100)]).await.unwrap();
    assert_eq!(db.drain().await, vec![100]);
    let maintain = tokio::spawn({
        let pool = db.store.pool().clone();
        let schema = db.store.schema().clone();
        async move { ranges::maintain(&pool, &schema, NOW).await }
    });
    let writer = if commit_during_wait {
        tokio::time::sleep(Duration::from_millis(500)).await;
        writer.commit().await.unwrap();
        None
    } else {
        Some(writer)
    };
    let m = tokio::time::timeout(Duration::from_secs(60), maintain)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(m.segments_dropped, 0, "{m:?}");
    if let Some(writer) = writer {
        writer.commit().await.unwrap();
    }
    assert!(db.ranges().await.contains(&"s101".to_string()));
    assert_eq!(db.drain().await, vec![99], "the writer's row is delivered");
    let m = db.store.maintain(NOW).await.unwrap();
    assert_eq!(
        m.segments_dropped, 1,
        "now every row of the range is out: {m:?}"
    );
    db.drop().await;
}

#[tokio::test]
async fn a_writer_that_commits_while_maintenance_waits_keeps_its_range() {
    a_writer_in_progress_keeps_its_range(true).await;
}

#[tokio::test]
async fn a_writer_that_outlasts_the_wait_keeps_its_range() {
    a_writer_in_progress_keeps_its_range(false).await;
}

/// A key whose partition is not `key`'s.
async fn other_partition_key(db: &Db, key: &str) -> String {
    let part = |k: String| {
        let pool = db.store.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT CAST(CRC32(?) % 64 AS SIGNED)")
                .bind(k)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let mine = part(key.to_string()).await;
    for i in 0.. {
        let k = format!("other-{i}");
        if part(k.clone()).await != mine {
            return k;
        }
    }
    unreachable!()
}

/// A session left open on the message table (an application's `REPEATABLE READ` transaction
/// that read it) holds the table's metadata lock, which dropping a range needs. Maintenance
/// gives up the round after its short wait instead of queueing every writer behind it, writers
/// go on, and the range goes once the session ends.
#[tokio::test]
async fn a_session_left_open_on_the_table_delays_a_drop_and_writers_go_on() {
    let db = Db::start().await;
    db.write(1, 101).await;
    assert_eq!(db.drain().await.len(), 100);
    db.write(101, 102).await;
    let mut app = db.conn().await;
    sqlx::raw_sql(&db.store.schema().render(
        "START TRANSACTION WITH CONSISTENT SNAPSHOT; SELECT COUNT(*) FROM {schema}.outbox",
    ))
    .execute(&mut app)
    .await
    .unwrap();
    let m = tokio::time::timeout(Duration::from_secs(60), db.store.maintain(NOW))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.segments_dropped, 0, "{m:?}");
    db.write(102, 110).await; // writers are not held behind the drop
    sqlx::query("COMMIT").execute(&mut app).await.unwrap();
    let m = db.store.maintain(NOW).await.unwrap();
    assert_eq!(m.segments_dropped, 1, "{m:?}");
    assert_eq!(sorted(db.drain().await), (101..110).collect::<Vec<_>>());
    db.drop().await;
}

/// A session left open for long (past a threshold lowered to 1 s in this test's process; a
/// minute otherwise) holds the table's metadata lock, and every try to change the ranges would
/// hold writers and relays behind a lock wait. The first round tries; later rounds leave the
/// ranges alone while a range still lies ahead of the writers; once the session ends, the next
/// round changes them at once. `measured_`: it reads every transaction of the server, so it
/// runs when no other test holds one.
#[tokio::test]
async fn measured_a_session_left_open_for_long_is_tried_past_once_then_left_alone() {
    let db = Db::start().await;
    let schema = db.store.schema().clone();
    ranges::set_old_transaction_secs(1);
    db.write(1, 51).await;
    let mut app = db.conn().await;
    sqlx::raw_sql(&schema.render(
        "START TRANSACTION WITH CONSISTENT SNAPSHOT; SELECT COUNT(*) FROM {schema}.outbox",
    ))
    .execute(&mut app)
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let mut conn = db.conn().await;
    assert!(
        !ranges::restraint(&mut conn, &schema).await.unwrap(),
        "the first round tries"
    );
    assert!(
        ranges::restraint(&mut conn, &schema).await.unwrap(),
        "the next ones leave the ranges alone"
    );
    // Restrained: a range ([101, 201)) still lies ahead of the writers, so none is cut.
    let m = db.store.maintain(KEEP).await.unwrap();
    assert_eq!(m.segments_created, 0, "{m:?}");
    assert_eq!(db.ranges().await, ["s101", "s201", "s_max"]);
    sqlx::query("COMMIT").execute(&mut app).await.unwrap();
    // InnoDB refreshes the transactions it lists once they went unread for 0.1 s.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!ranges::restraint(&mut conn, &schema).await.unwrap());
    let m = db.store.maintain(KEEP).await.unwrap();
    assert_eq!(m.segments_created, 1, "{m:?}");
    assert_eq!(db.ranges().await, ["s101", "s201", "s301", "s_max"]);
    assert_eq!(sorted(db.drain().await), (1..51).collect::<Vec<_>>());
    db.drop().await;
}

/// The same restraint seen from what a round does, with a transaction open for long that holds
/// no lock the ranges need (so every cut tried succeeds): the first round cuts the next range;
/// the next leaves a cut it could make while a range still lies ahead of the writers; once the
/// writers are within one width of the last range it cuts again; once the transaction ends,
/// rounds are free again. `measured_` for the same reason as above.
#[tokio::test]
async fn measured_a_restrained_round_cuts_only_the_range_the_writers_are_about_to_need() {
    let db = Db::start().await;
    let schema = db.store.schema().clone();
    ranges::set_old_transaction_secs(1);
    db.write(1, 51).await;
    let mut old = db.conn().await;
    sqlx::raw_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        .execute(&mut old)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    // The first round past it tries: two widths beyond seq 50 need [201, 301).
    assert_eq!(db.store.maintain(KEEP).await.unwrap().segments_created, 1);
    assert_eq!(db.ranges().await, ["s101", "s201", "s301", "s_max"]);
    // Seq 150: [151, 301) still lies ahead, so the cut a free round makes waits.
    db.write(51, 151).await;
    assert_eq!(db.store.maintain(KEEP).await.unwrap().segments_created, 0);
    assert_eq!(db.ranges().await, ["s101", "s201", "s301", "s_max"]);
    // Seq 250: less than one width left; the writers are about to need one, so it is cut.
    db.write(151, 251).await;
    assert_eq!(db.store.maintain(KEEP).await.unwrap().segments_created, 2);
    assert_eq!(
        db.ranges().await,
        ["s101", "s201", "s301", "s401", "s501", "s_max"]
    );
    sqlx::query("COMMIT").execute(&mut old).await.unwrap();
    // InnoDB refreshes the transactions it lists once they went unread for 0.1 s.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut conn = db.conn().await;
    assert!(!ranges::restraint(&mut conn, &schema).await.unwrap());
    assert_eq!(sorted(db.drain().await), (1..251).collect::<Vec<_>>());
    db.drop().await;
}

/// A database migrated before ranges existed (version 2, with rows) is split into ranges in
/// place: its rows stay, pending ones are still delivered, and ranges lie ahead.
#[tokio::test]
async fn migrating_a_version_2_outbox_keeps_its_rows_and_lays_ranges_ahead() {
    let pool = connect_pool(&server_url(), 4).await.unwrap();
    let schema = Schema::new(&outbox_testkit::unique_name("ret_up")).unwrap();
    outbox_mysql::apply_migrations(
        &pool,
        &schema,
        "outbox_migrations",
        "outbox-migrate",
        &outbox_mysql::MIGRATIONS[..2],
        &|sql| schema.render(sql),
    )
    .await
    .unwrap();
    for n in 0..30 {
        sqlx::query(&schema.render(
            "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('order', ?, 'placed', JSON_OBJECT('n', ?))",
        ))
        .bind(format!("k{}", n % 3))
        .bind(n)
        .execute(&pool)
        .await
        .unwrap();
    }
    assert_eq!(migrate(&pool, &schema).await.unwrap(), vec![3, 4]);
    let mut conn = MySqlConnection::connect(&server_url()).await.unwrap();
    let r = ranges::ranges(&mut conn, &schema).await.unwrap();
    assert_eq!(
        r.len(),
        4,
        "the rows' range, two ahead, the catch-all: {r:?}"
    );
    assert_eq!(r[0].below, Some(31));
    let store = MysqlStore::new(pool.clone(), schema.clone());
    let member = MemberId::random("up");
    let parts = store
        .rebalance(&member, Duration::from_secs(60))
        .await
        .unwrap();
    let got = store
        .claim(&member, &parts, ClaimLimits::rows(100), OnFailed::Block)
        .await
        .unwrap();
    assert_eq!(
        sorted(got.iter().map(n_of).collect()),
        (0..30).collect::<Vec<_>>()
    );
    sqlx::raw_sql(&schema.render("DROP DATABASE {schema}"))
        .execute(&pool)
        .await
        .unwrap();
}

/// Claims read no range below `passed_below` (the server prunes those ranges): set by hand
/// past rows that are in fact pending, the claim does not see them; set back, it does. Only
/// retention sets it, and only past ranges every position has passed.
#[tokio::test]
async fn claims_read_nothing_below_passed_below() {
    let db = Db::start().await;
    db.write(1, 51).await;
    let set = |to: i64| {
        let pool = db.store.pool().clone();
        let sql = db
            .store
            .schema()
            .render("UPDATE {schema}.outbox_settings SET value = ? WHERE name = 'passed_below'");
        async move {
            sqlx::query(&sql).bind(to).execute(&pool).await.unwrap();
        }
    };
    set(101).await;
    assert!(db.claim().await.is_empty());
    set(0).await;
    assert_eq!(sorted(db.drain().await), (1..51).collect::<Vec<_>>());
    db.drop().await;
}
