//! The second phase of a run: with `--through-inbox` the inbox beside the outbox, then the
//! relays started as processes of the `outbox` binary and the inbox's `outbox inbox` daemons
//! and handler processes.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use outbox_db::Backend;
use outbox_inbox::InboxDatabase;

use super::prepare::Setup;
use super::{Settings, INBOX_DAEMONS, INBOX_HANDLERS};
use crate::relays::Relays;

/// The run's processes, running.
pub(super) struct Processes {
    /// The relays.
    pub relays: Arc<Mutex<Relays>>,
    /// Every group of processes the faults hit: the relays, then the inbox daemons and the
    /// handlers.
    pub groups: Vec<Arc<Mutex<Relays>>>,
    /// `--through-inbox`: the inbox, and the URL its daemons read the broker with.
    pub inbox: Option<(InboxDatabase, String)>,
    /// When every process had been started: the run's clock.
    pub started: Instant,
}

/// Makes the inbox (`--through-inbox`) and starts the relays and the inbox's processes.
pub(super) async fn start(settings: &Settings, setup: &Setup) -> anyhow::Result<Processes> {
    // The receiving side: the inbox beside the outbox, fed from the scratch stream. On
    // MySQL/MariaDB the inbox's least privileges are not written down: its daemons and handlers
    // run as the URL's user there (the relays as the relay login).
    let inbox_db_url = match (&setup.logins, setup.db.backend()) {
        (Some(_), Backend::Mysql) => setup.admin_db_url.clone(),
        _ => setup.relay_db_url.clone(),
    };
    let inbox = if settings.through_inbox {
        Some(prepare_inbox(settings, setup, &inbox_db_url).await?)
    } else {
        None
    };
    let relays = Arc::new(Mutex::new(start_relays(settings, setup)?));
    let mut groups = vec![relays.clone()];
    if let Some((_, source)) = &inbox {
        groups.extend(start_inbox(settings, setup, &inbox_db_url, source)?);
    }
    Ok(Processes {
        relays,
        groups,
        inbox,
        started: Instant::now(),
    })
}

/// Makes the inbox in the database `inbox_db_url` names; returns it and the source URL its
/// daemons read the run's destination with.
async fn prepare_inbox(
    settings: &Settings,
    setup: &Setup,
    inbox_db_url: &str,
) -> anyhow::Result<(InboxDatabase, String)> {
    let (db, sink_url) = (&setup.db, &setup.sink_url);
    anyhow::ensure!(
        db.backend() != Backend::Sqlite,
        "--through-inbox runs on PostgreSQL or MySQL/MariaDB: the inbox daemons and handler \
         processes write at once, and SQLite takes one writer at a time"
    );
    anyhow::ensure!(
        sink_url.starts_with("nats://") || sink_url.starts_with("tls://"),
        "--through-inbox reads the broker with `outbox inbox`, whose sources in this build are \
         NATS JetStream and Redis Streams: pass a nats:// sink"
    );
    let inbox = crate::inbox::prepare(inbox_db_url, db.schema()).await?;
    // The NATS scratch stream is the destination's first token, upper-cased
    // (outbox-sinks `nats/reader.rs`).
    let prefix = setup.destination.split('.').next().unwrap_or_default();
    let base = sink_url.split('?').next().unwrap_or(sink_url);
    let source = format!(
        "{base}?stream={}&ack_wait={}ms",
        prefix.to_ascii_uppercase(),
        (settings.lease * 2 / 3).as_millis().max(500)
    );
    Ok((inbox, source))
}

/// Starts `settings.relays` relay processes.
fn start_relays(settings: &Settings, setup: &Setup) -> anyhow::Result<Relays> {
    let Settings {
        lease, cdc, switch, ..
    } = *settings;
    // The relays' sink waits for each acknowledgement a quarter of their short lease (NATS
    // waits 5 s by default, longer than the third of the default 3 s lease a publish may take;
    // a quarter leaves the sink room to report its own timeout first); an explicit ack_timeout
    // that does not fit in a third is refused here, as `outbox relay` would refuse it.
    let relay_sink = outbox_sinks::with_default_ack_timeout(&setup.sink_url, lease / 4);
    if let Some(ack) = outbox_sinks::ack_timeout(&relay_sink)? {
        outbox_relay::RelayConfig {
            lease,
            ..outbox_relay::RelayConfig::default()
        }
        .check_ack_timeout(ack)
        .map_err(|why| outbox_core::Error::config(format!("verify: {why}")))?;
    }
    // Nothing secret on the command line: the database and sink URLs go in the environment.
    let mode = if cdc && !switch { "cdc" } else { "polling" };
    let relay_args: Vec<String> = [
        "relay",
        "--mode",
        mode,
        "--schema",
        setup.db.schema(),
        "--destination",
        &setup.destination,
        "--lease",
        &humantime::format_duration(lease).to_string(),
        "--poll-interval",
        "100ms",
        "--workers",
        "1",
        "--batch-size",
        "200",
        "--max-attempts",
        "100000",
        "--backoff-base",
        "100ms",
        "--backoff-max",
        "2s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut relays = Relays::new(
        settings.program.clone(),
        relay_args,
        setup.tmp.clone(),
        setup.relay_db_url.clone(),
        relay_sink,
        setup.stdout_path.clone(),
    )
    .with_probes();
    for i in 0..settings.relays {
        let c = relays.spawn_one(i)?;
        relays.children.push(c);
    }
    Ok(relays)
}

/// Starts the `outbox inbox` daemons reading `source` and the handler processes, a group each.
fn start_inbox(
    settings: &Settings,
    setup: &Setup,
    inbox_db_url: &str,
    source: &str,
) -> anyhow::Result<Vec<Arc<Mutex<Relays>>>> {
    let schema = setup.db.schema();
    let lease_arg = humantime::format_duration(settings.lease).to_string();
    let daemon_args: Vec<String> = [
        "inbox",
        "--schema",
        schema,
        "--batch-size",
        "200",
        "--poll-interval",
        "20ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let handler_args: Vec<String> = [
        "verify-inbox-handler",
        "--schema",
        schema,
        "--lease",
        &lease_arg,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut groups = Vec::new();
    for (role, args, env, count) in [
        (
            "inbox",
            daemon_args,
            Some("OUTBOX_INBOX_SOURCE"),
            INBOX_DAEMONS,
        ),
        ("handler", handler_args, None, INBOX_HANDLERS),
    ] {
        let mut group = Relays::new(
            settings.program.clone(),
            args,
            setup.tmp.clone(),
            inbox_db_url.to_string(),
            source.to_string(),
            None,
        )
        .with_role(role, env);
        for i in 0..count {
            let c = group.spawn_one(i)?;
            group.children.push(c);
        }
        groups.push(Arc::new(Mutex::new(group)));
    }
    Ok(groups)
}
