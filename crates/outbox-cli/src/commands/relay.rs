//! `outbox relay`: run the relay until SIGINT/SIGTERM.

use std::process::ExitCode;

use outbox_core::ErrorKind;
use outbox_relay::Relay;
use tracing::info;

use crate::config::RelaySettings;

pub async fn run(s: RelaySettings, print_config: bool) -> anyhow::Result<ExitCode> {
    if print_config {
        let r = &s.relay;
        let settings = serde_json::json!({
            "database_url": outbox_core::redact::url(&s.db.url),
            "schema": s.db.schema,
            "sink": outbox_core::redact::url(&s.sink),
            "destination": r.destination.as_str(),
            "allow_destinations": r
                .destination_rules
                .patterns()
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>(),
            "batch_size": r.batch_size,
            "batch_bytes": r.batch_bytes,
            "workers": r.workers,
            "poll_interval": humantime::format_duration(r.poll_interval).to_string(),
            "listen": r.listen,
            "lease": humantime::format_duration(r.lease).to_string(),
            "store_timeout": humantime::format_duration(r.store_timeout).to_string(),
            "max_attempts": r.retry.max_attempts,
            "backoff_base": humantime::format_duration(r.retry.base).to_string(),
            "backoff_max": humantime::format_duration(r.retry.max).to_string(),
            "on_failed": r.on_failed,
        });
        println!("{}", serde_json::to_string_pretty(&settings)?);
        return Ok(ExitCode::SUCCESS);
    }
    // Pool: each worker claims and marks on its own, plus LISTEN and lease renewals.
    let pool_size = (s.relay.workers as u32) * 2 + 2;
    let database = outbox_db::open(&s.db.url, &s.db.schema, pool_size).await?;
    let store = database.store();
    // Fail fast, with the fix in the message, when the schema was never migrated.
    if let Err(e) = store.stats().await {
        if e.kind() == ErrorKind::Schema {
            anyhow::bail!(
                "{} has no outbox tables: run `outbox migrate` first ({e})",
                database.place()
            );
        }
        return Err(e.into());
    }
    let sink = outbox_sinks::connect(&s.sink).await?;
    info!(database = %outbox_core::redact::url(&s.db.url), outbox = %database.place(),
          sink = %outbox_core::redact::url(&s.sink), "relay configured");
    let shutdown = crate::shutdown::on_signal();
    Relay::new(store, sink, s.relay).run(shutdown).await;
    Ok(ExitCode::SUCCESS)
}
