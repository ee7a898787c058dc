//! Least-privilege roles (docs/roles.md), as production runs them: the tables owned by a role of
//! their own, each part logged in as a role holding only `outbox migrate --grant`'s privileges,
//! and an upgrade from version 6 that keeps every role working with no manual GRANT.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{ClaimLimits, Grant, MemberId, OnFailed, Outcome, Part, RedriveScope, Store};
use outbox_postgres::{connect_pool, migrate, PgStore, Schema, Writer, MIGRATIONS};
use sqlx::PgPool;

mod common;
use common::{database_url, msg};

/// `database_url()` logged in as `role` (trust authentication on this machine's loopback).
fn url_as(role: &str) -> String {
    let url = database_url();
    let (scheme, rest) = url.split_once("://").unwrap();
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    format!("{scheme}://{role}@{host}")
}

/// A login role of this test's own, dropped by [`drop_roles`].
async fn login(admin: &PgPool, name: &str) {
    outbox_postgres::create_login(admin, name, "not-a-secret")
        .await
        .unwrap();
}

async fn drop_roles(admin: &PgPool, schema: &Schema, roles: &[&str]) {
    let _ = sqlx::raw_sql(&schema.render("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .execute(admin)
        .await;
    for r in roles {
        let _ = outbox_postgres::drop_login(admin, r).await;
    }
}

/// Lets `role` create schemas in this database (and nothing else): an owner of its own.
async fn may_create_schemas(admin: &PgPool, role: &str) {
    let sql: String = sqlx::query_scalar(
        "SELECT format('GRANT CREATE ON DATABASE %I TO %I', current_database(), $1::text)",
    )
    .bind(role)
    .fetch_one(admin)
    .await
    .unwrap();
    sqlx::raw_sql(&sql).execute(admin).await.unwrap();
}

/// Whether `sql`, run as the role of `pool`, is refused for lack of a privilege.
async fn refused(pool: &PgPool, sql: &str) -> bool {
    match sqlx::raw_sql(sql).execute(pool).await {
        Ok(_) => false,
        Err(sqlx::Error::Database(e)) => e.code().as_deref() == Some("42501"),
        Err(e) => panic!("{sql}: {e}"),
    }
}

/// One relay round as `store`'s role: partitions, a claim, a publish recorded, maintenance.
async fn relay_round(store: &Arc<PgStore>) -> Vec<uuid::Uuid> {
    let m = MemberId::random("relay");
    let parts = store.rebalance(&m, Duration::from_secs(30)).await.unwrap();
    assert_eq!(parts.len(), 64, "the only member owns every partition");
    let mut ids = Vec::new();
    for _ in 0..4 {
        let got = store
            .claim(&m, &parts, ClaimLimits::rows(1000), OnFailed::Block)
            .await
            .unwrap();
        let outcomes: Vec<_> = got
            .iter()
            .map(|r| Outcome::Published { seq: r.seq })
            .collect();
        store.complete(&m, &outcomes).await.unwrap();
        ids.extend(got.iter().map(|r| r.id));
    }
    store.maintain(Duration::from_secs(3600)).await.unwrap();
    store.release(&m).await.unwrap();
    ids
}

/// Every part logged in as a role holding exactly `--grant`'s privileges does its job: the
/// writer enqueues (and may not write `seq` nor read), the relay claims, records, parks and
/// maintains segments, the operator redrives, the reader reads and may change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_part_does_its_job_with_only_the_privileges_granted() {
    let admin = connect_pool(&database_url(), 2).await.unwrap();
    let tag = outbox_testkit::unique_name("roles");
    let names: Vec<String> = ["own", "w", "r", "o", "rd"]
        .iter()
        .map(|p| format!("{tag}_{p}"))
        .collect();
    let [own, w, r, o, rd] = [&names[0], &names[1], &names[2], &names[3], &names[4]];
    for n in &names {
        login(&admin, n).await;
    }
    // The tables belong to a role of their own, which may create a schema and nothing else.
    may_create_schemas(&admin, own).await;
    let schema = Schema::new(&tag).unwrap();
    let owner = connect_pool(&url_as(own), 2).await.unwrap();
    migrate(&owner, &schema).await.unwrap();
    let grants: Vec<Grant> = [
        (Part::Writer, w),
        (Part::Relay, r),
        (Part::Operator, o),
        (Part::Reader, rd),
    ]
    .iter()
    .map(|(p, n)| Grant::new(*p, n).unwrap())
    .collect();
    // The owner grants what it owns; the relay's membership of the owner role (for segment
    // maintenance) takes a superuser in PostgreSQL 15, which the owner is told.
    let notes = outbox_postgres::grant(&owner, &schema, &grants)
        .await
        .unwrap();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains(&format!("GRANT {own} TO {r}")),
        "{notes:?}"
    );
    let notes = outbox_postgres::grant(&admin, &schema, &grants[1..2])
        .await
        .unwrap();
    assert!(notes.is_empty(), "{notes:?}");

    // The writer: the API and the SQL contract's plain insert.
    let writer = connect_pool(&url_as(w), 2).await.unwrap();
    let mut tx = writer.begin().await.unwrap();
    Writer::new(&schema)
        .enqueue(&mut tx, &msg("k", 1))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    sqlx::raw_sql(&schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', 'k', 'placed', '{\"n\": 2}')",
    ))
    .execute(&writer)
    .await
    .unwrap();
    assert!(
        refused(
            &writer,
            &schema.render(
                "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload, seq)
                 VALUES ('order', 'k', 'placed', '{}', 1)"
            )
        )
        .await,
        "a hand-written seq is refused"
    );
    assert!(
        refused(
            &writer,
            &schema.render("SELECT payload FROM {schema}.outbox")
        )
        .await
    );
    assert!(
        refused(
            &writer,
            &schema.render("DELETE FROM {schema}.outbox_positions")
        )
        .await
    );

    // The relay: both messages, then a failed one parked.
    let relay = Arc::new(PgStore::new(
        connect_pool(&url_as(r), 4).await.unwrap(),
        schema.clone(),
    ));
    assert_eq!(relay_round(&relay).await.len(), 2);
    let mut tx = writer.begin().await.unwrap();
    Writer::new(&schema)
        .enqueue(&mut tx, &msg("bad", 3))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let m = MemberId::random("relay");
    let parts = relay.rebalance(&m, Duration::from_secs(30)).await.unwrap();
    let got = relay
        .claim(&m, &parts, ClaimLimits::rows(10), OnFailed::Block)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    relay
        .complete(
            &m,
            &[Outcome::Failed {
                seq: got[0].seq,
                error: "rejected".into(),
            }],
        )
        .await
        .unwrap();
    relay.release(&m).await.unwrap();
    let made: i64 =
        sqlx::query_scalar(&schema.render("SELECT count(*) FROM {schema}.outbox_segments"))
            .fetch_one(relay.pool())
            .await
            .unwrap();
    assert!(made >= 2, "the relay maintains segments");

    // The reader sees it and may not redrive; the operator redrives it.
    let reader = PgStore::new(connect_pool(&url_as(rd), 2).await.unwrap(), schema.clone());
    assert_eq!(reader.failed(10).await.unwrap().len(), 1);
    assert_eq!(reader.stats().await.unwrap().failed, 1);
    let refused_redrive = reader
        .redrive(&RedriveScope::All, "not mine to do")
        .await
        .unwrap_err();
    assert!(
        refused_redrive.to_string().contains("permission denied"),
        "{refused_redrive}"
    );
    let operator = PgStore::new(connect_pool(&url_as(o), 2).await.unwrap(), schema.clone());
    assert_eq!(
        operator
            .redrive(&RedriveScope::All, "fixed the consumer")
            .await
            .unwrap(),
        1
    );
    assert!(
        refused(
            operator.pool(),
            &schema.render("DELETE FROM {schema}.outbox_positions")
        )
        .await
    );
    assert_eq!(relay_round(&relay).await.len(), 1, "the redriven message");

    for p in [
        writer,
        relay.pool().clone(),
        reader.pool().clone(),
        operator.pool().clone(),
        owner,
    ] {
        p.close().await;
    }
    drop_roles(
        &admin,
        &schema,
        &names.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await;
}

/// A schema at version 6 whose writer and relay roles hold what they needed then (the writer
/// only INSERT on `outbox`, the relay SELECT on the identity's sequence for the claims' floor):
/// `outbox migrate` to the current version, run by its owner, leaves both working with no manual
/// GRANT. Version 7 recreated the sequence; before it carried grants over, the writer's insert
/// failed with "permission denied for sequence outbox_seq_v2" and every claim with the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_from_version_6_keeps_least_privilege_writers_and_relays_working() {
    let admin = connect_pool(&database_url(), 2).await.unwrap();
    let tag = outbox_testkit::unique_name("roles_up");
    let (own, w, r) = (format!("{tag}_own"), format!("{tag}_w"), format!("{tag}_r"));
    for n in [&own, &w, &r] {
        login(&admin, n).await;
    }
    may_create_schemas(&admin, &own).await;
    let schema = Schema::new(&tag).unwrap();
    let owner = connect_pool(&url_as(&own), 2).await.unwrap();
    sqlx::raw_sql(&schema.render(
        "CREATE SCHEMA {schema};
         CREATE TABLE {schema}.outbox_migrations (version integer PRIMARY KEY, name text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now());",
    ))
    .execute(&owner)
    .await
    .unwrap();
    for (v, name, sql) in MIGRATIONS.iter().filter(|(v, _, _)| *v <= 6) {
        sqlx::raw_sql(&schema.render(sql))
            .execute(&owner)
            .await
            .unwrap();
        sqlx::query(
            &schema
                .render("INSERT INTO {schema}.outbox_migrations (version, name) VALUES ($1, $2)"),
        )
        .bind(v)
        .bind(name)
        .execute(&owner)
        .await
        .unwrap();
    }
    // What each role held at version 6, granted by hand as an operator would have.
    sqlx::raw_sql(&schema.render(&format!(
        "GRANT USAGE ON SCHEMA {{schema}} TO {w}, {r};
         GRANT INSERT ON {{schema}}.outbox TO {w};
         GRANT SELECT ON ALL TABLES IN SCHEMA {{schema}} TO {r};
         GRANT INSERT, UPDATE, DELETE ON {{schema}}.outbox_positions, {{schema}}.outbox_parked,
               {{schema}}.outbox_partitions, {{schema}}.outbox_members TO {r};
         GRANT SELECT ON SEQUENCE {{schema}}.outbox_seq_v2 TO {r};"
    )))
    .execute(&owner)
    .await
    .unwrap();
    sqlx::raw_sql(&format!("GRANT {own} TO {r}"))
        .execute(&admin)
        .await
        .unwrap();
    let insert = schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', 'k', 'placed', '{}')",
    );
    let writer = connect_pool(&url_as(&w), 2).await.unwrap();
    sqlx::raw_sql(&insert).execute(&writer).await.unwrap();

    assert_eq!(migrate(&owner, &schema).await.unwrap(), vec![7, 8]);

    sqlx::raw_sql(&insert)
        .execute(&writer)
        .await
        .expect("the writer inserts after the upgrade with no manual GRANT");
    let relay = Arc::new(PgStore::new(
        connect_pool(&url_as(&r), 4).await.unwrap(),
        schema.clone(),
    ));
    assert_eq!(
        relay_round(&relay).await.len(),
        2,
        "the relay claims both rows after the upgrade"
    );
    writer.close().await;
    relay.pool().close().await;
    owner.close().await;
    drop_roles(&admin, &schema, &[&w, &r, &own]).await;
}

/// A grant taken away by hand (or by a migration that recreates an object) comes back at the next
/// `outbox migrate`: every recorded grant is applied again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_migrate_applies_the_recorded_grants_again() {
    let admin = connect_pool(&database_url(), 2).await.unwrap();
    let tag = outbox_testkit::unique_name("roles_again");
    let w = format!("{tag}_w");
    login(&admin, &w).await;
    let schema = Schema::new(&tag).unwrap();
    migrate(&admin, &schema).await.unwrap();
    outbox_postgres::grant(&admin, &schema, &[Grant::new(Part::Writer, &w).unwrap()])
        .await
        .unwrap();
    sqlx::raw_sql(&schema.render(&format!(
        "REVOKE USAGE ON SEQUENCE {{schema}}.outbox_seq_v2 FROM {w}"
    )))
    .execute(&admin)
    .await
    .unwrap();
    let writer = connect_pool(&url_as(&w), 2).await.unwrap();
    let insert = schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', 'k', 'placed', '{}')",
    );
    assert!(refused(&writer, &insert).await, "revoked");
    assert_eq!(migrate(&admin, &schema).await.unwrap(), Vec::<i32>::new());
    sqlx::raw_sql(&insert).execute(&writer).await.unwrap();
    writer.close().await;
    drop_roles(&admin, &schema, &[&w]).await;
}

/// A grant to a role that does not exist is refused with how to create it; a part that does not
/// exist is refused before anything runs.
#[tokio::test]
async fn a_grant_to_a_missing_role_says_how_to_create_it() {
    let admin = connect_pool(&database_url(), 2).await.unwrap();
    let schema = Schema::new(&outbox_testkit::unique_name("roles_missing")).unwrap();
    migrate(&admin, &schema).await.unwrap();
    let e = outbox_postgres::grant(
        &admin,
        &schema,
        &[Grant::new(Part::Relay, "no_such_role_here").unwrap()],
    )
    .await
    .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("no_such_role_here") && text.contains("CREATE ROLE"),
        "{text}"
    );
    drop_roles(&admin, &schema, &[]).await;
}
