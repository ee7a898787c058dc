//! `outbox migrate`: create or upgrade the outbox tables.

use std::process::ExitCode;

use crate::config::DbSettings;

/// Applies the migrations, then installs or removes the NOTIFY doorbell when asked, then sets
/// up CDC mode for `cdc_group` when asked, or the binlog route (MySQL/MariaDB), then gives the
/// parts in `grants` their least privileges (last, so CDC mode's objects are granted too).
pub async fn run(
    db: DbSettings,
    notify: Option<bool>,
    cdc_group: Option<&str>,
    binlog: bool,
    grants: &[outbox_core::Grant],
) -> anyhow::Result<ExitCode> {
    let database = outbox_db::open(&db.url, &db.schema, 2).await?;
    let applied = database.migrate().await?;
    // The schema and database names come from config: shown through the terminal rule.
    let place = outbox_core::text::terminal(&database.place()).into_owned();
    if applied.is_empty() {
        println!("{place} is up to date");
    } else {
        println!("{place}: applied migrations {applied:?}");
    }
    if let Some(on) = notify {
        database.set_notify(on).await?;
        let what = if on {
            "installed (run relays with --listen)"
        } else {
            "removed"
        };
        println!("{place}: NOTIFY doorbell {what}");
    }
    if let Some(group) = cdc_group {
        cdc(&database, group).await?;
    }
    if binlog {
        database.enable_binlog_route().await?;
        println!(
            "{place}: binlog route on: writers' inserts run no trigger; relays give each \
             committed row its position from the binlog (`outbox_sequence`), taking from the \
             table first what was written before (docs/engine-mysql.md, \"The binlog route\")"
        );
    }
    if !grants.is_empty() {
        let notes = database.grant(grants).await?;
        for g in grants {
            println!("{place}: granted {g} (docs/roles.md); kept by every later migrate");
        }
        for note in &notes {
            println!("{place}: warning: {note}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--cdc`: the publication and the slot, and what the server's settings mean for them.
async fn cdc(database: &outbox_db::Database, group: &str) -> anyhow::Result<()> {
    let (names, setup) = database.migrate_cdc(group).await?;
    let said = |created: bool| if created { "created" } else { "present" };
    println!(
        "CDC: publication `{}` {}, replication slot `{}` {}",
        names.publication,
        said(setup.publication_created),
        names.slot,
        said(setup.slot_created)
    );
    if setup.slot_created {
        println!(
            "CDC: the slot starts now: messages written before it are not in its stream; \
             `outbox relay --mode cdc` delivers those a polling relay has not, first, then reads \
             the stream (docs/cdc.md, \"Switching a running outbox\")"
        );
    }
    if setup.failover_slot {
        println!(
            "CDC: the slot is a failover slot: with sync_replication_slots = on on the standbys \
             it follows a failover (docs/cdc.md, \"Failover\")"
        );
    }
    println!(
        "CDC: writers emit with SELECT {}.outbox_emit('{{…}}') (refused while the slot is lost)",
        names.schema.as_str()
    );
    for note in &setup.notes {
        println!("CDC: warning: {note}");
    }
    match setup.max_slot_wal_keep_mb {
        Some(mb) => println!(
            "CDC: max_slot_wal_keep_size = {mb} MB: a slot that falls further behind is \
             invalidated and the relay must be set up again (docs/cdc.md)"
        ),
        None => println!(
            "CDC: warning: max_slot_wal_keep_size is unlimited (-1): while no relay reads the \
             slot, PostgreSQL keeps every WAL segment until the disk fills; set a bound \
             (ALTER SYSTEM SET max_slot_wal_keep_size = '20GB'; SELECT pg_reload_conf()) and \
             alert on the slot's retained bytes"
        ),
    }
    Ok(())
}

/// Creates or upgrades the inbox tables and its processing queue.
pub async fn inbox(db: DbSettings) -> anyhow::Result<ExitCode> {
    let inbox = outbox_inbox::InboxDatabase::open(&db.url, &db.schema, 2).await?;
    let applied = inbox.migrate().await?;
    let place = inbox.place();
    if applied.is_empty() {
        println!("{place} is up to date");
    } else {
        println!("{place}: applied migrations {applied:?}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `--adopt-debezium` / `--release-debezium`: the copy trigger on a Debezium outbox table.
pub async fn debezium(
    db: &DbSettings,
    adopt: Option<&str>,
    release: Option<&str>,
) -> anyhow::Result<()> {
    let Some(table) = adopt.or(release) else {
        return Ok(());
    };
    let database = outbox_db::open(&db.url, &db.schema, 2).await?;
    let shown = outbox_core::text::terminal(table).into_owned();
    let adopted = if adopt.is_some() {
        Some(database.adopt_debezium(table).await?)
    } else {
        database.release_debezium(table).await?;
        None
    };
    match adopted {
        Some(a) => {
            println!(
            "debezium table `{shown}` adopted: each INSERT is copied into the outbox in its own \
             transaction (trace context: {}; additional columns as headers: {})",
            if a.tracing { "tracingspancontext" } else { "none" },
            if a.additional.is_empty() { "none".to_string() } else { a.additional.join(", ") }
        )
        }
        None => println!("debezium table `{shown}` released: its INSERTs are no longer copied"),
    }
    Ok(())
}
