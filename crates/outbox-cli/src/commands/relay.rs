//! `outbox relay`: run the relay until SIGINT/SIGTERM.

use std::process::ExitCode;
use std::sync::Arc;

use outbox_core::{ErrorKind, Store};
use outbox_relay::Relay;
use tracing::info;

use crate::config::RelaySettings;

pub async fn run(s: RelaySettings) -> anyhow::Result<ExitCode> {
    // Pool: each worker claims and marks on its own, plus LISTEN and lease renewals.
    let pool_size = (s.relay.workers as u32) * 2 + 2;
    let store = super::open_store(&s.db, pool_size).await?;
    // Fail fast, with the fix in the message, when the schema was never migrated.
    if let Err(e) = store.stats().await {
        if e.kind() == ErrorKind::Schema {
            anyhow::bail!(
                "schema `{}` has no outbox tables: run `outbox migrate` first ({e})",
                s.db.schema
            );
        }
        return Err(e.into());
    }
    let sink = outbox_sinks::connect(&s.sink).await?;
    info!(database = %outbox_core::redact::url(&s.db.url), schema = %s.db.schema,
          sink = %outbox_core::redact::url(&s.sink), "relay configured");
    let shutdown = crate::shutdown::on_signal();
    let store: Arc<dyn Store> = Arc::new(store);
    Relay::new(store, sink, s.relay).run(shutdown).await;
    Ok(ExitCode::SUCCESS)
}
