//! `outbox relay`: run the relay until SIGINT/SIGTERM.

use std::process::ExitCode;

use outbox_core::ErrorKind;
use outbox_relay::Relay;
use tracing::info;

use crate::config::RelaySettings;

pub async fn run(s: RelaySettings) -> anyhow::Result<ExitCode> {
    // Pool: each worker claims and marks on its own, plus LISTEN and lease renewals.
    let pool_size = (s.relay.workers as u32) * 2 + 2;
    let backend = super::Backend::open(&s.db, pool_size).await?;
    let store = backend.store();
    // Fail fast, with the fix in the message, when the schema was never migrated.
    if let Err(e) = store.stats().await {
        if e.kind() == ErrorKind::Schema {
            anyhow::bail!(
                "{} has no outbox tables: run `outbox migrate` first ({e})",
                backend.place(&s.db)
            );
        }
        return Err(e.into());
    }
    let sink = outbox_sinks::connect(&s.sink).await?;
    info!(database = %outbox_core::redact::url(&s.db.url), outbox = %backend.place(&s.db),
          sink = %outbox_core::redact::url(&s.sink), "relay configured");
    let shutdown = crate::shutdown::on_signal();
    Relay::new(store, sink, s.relay).run(shutdown).await;
    Ok(ExitCode::SUCCESS)
}
