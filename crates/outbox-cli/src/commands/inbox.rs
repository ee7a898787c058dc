//! `outbox inbox`: the ingest daemon, until SIGINT/SIGTERM.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::ErrorKind;
use outbox_inbox::daemon::{self, IngestMetrics};
use outbox_inbox::source::SourceOptions;
use outbox_inbox::InboxDatabase;
use tracing::info;

use crate::config::InboxSettings;

/// How often the daemon runs the queue's maintenance and the inbox retention.
const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(30);
/// How long the ingest loop may go without finishing a step before /livez fails: a fetch waits
/// at most its source's wait (SQS: 20 s), a commit the database's statement timeout, a pause
/// 10 s; twice the longest with room to spare.
const INGEST_LIVE_BOUND: Duration = Duration::from_secs(120);

pub async fn run(s: InboxSettings, args: &crate::cli::InboxArgs) -> anyhow::Result<ExitCode> {
    if args.print_config {
        let settings = serde_json::json!({
            "database_url": outbox_core::redact::url(&s.db.url),
            "schema": s.db.schema,
            "source": outbox_core::redact::url(&s.source),
            "batch_size": s.daemon.batch,
            "poll_interval": humantime::format_duration(s.daemon.poll_interval).to_string(),
            "retention": humantime::format_duration(s.daemon.retention).to_string(),
            "metrics_addr": s.metrics_addr.map(|a| a.to_string()),
        });
        println!("{}", serde_json::to_string_pretty(&settings)?);
        return Ok(ExitCode::SUCCESS);
    }
    let observe = match s.metrics_addr {
        Some(addr) => Some(crate::observe::start(addr, &crate::observe::INBOX_METRICS).await?),
        None => None,
    };
    let db = InboxDatabase::open(&s.db.url, &s.db.schema, 4).await?;
    if let Err(e) = db.check().await {
        if e.kind() == ErrorKind::Schema {
            anyhow::bail!(
                "{} has no inbox tables: run `outbox migrate --inbox` first ({e})",
                db.place()
            );
        }
        return Err(e.into());
    }
    let source = outbox_inbox::source::open(
        &s.source,
        &SourceOptions {
            batch: s.daemon.batch,
        },
    )
    .await?;
    info!(database = %outbox_core::redact::url(&s.db.url), inbox = %db.place(),
          source = %source.describe(), "inbox configured");
    let tracing = match &args.otlp_endpoint {
        Some(url) => Some(outbox_observe::install_tracing(url, "outbox-inbox")?),
        None => None,
    };
    let shutdown = crate::shutdown::on_signal();
    let metrics = Arc::new(IngestMetrics::default());
    let server = observe.map(|o| {
        let ingest = outbox_observe::Loop {
            name: format!("ingest of {}", source.name()),
            pulse: metrics.pulse.clone(),
            bound: INGEST_LIVE_BOUND,
        };
        o.serve(
            outbox_observe::Target::inbox(db.queue(), vec![ingest]),
            shutdown.clone(),
        )
    });
    let housekeeping = tokio::spawn(daemon::housekeeping(
        db.clone(),
        s.daemon.retention,
        HOUSEKEEPING_EVERY,
        shutdown.clone(),
    ));
    let result = daemon::run(
        db.daemon()?,
        source,
        s.daemon.clone(),
        metrics.clone(),
        shutdown.clone(),
    )
    .await;
    shutdown.cancel();
    housekeeping.abort();
    if let Some(server) = server {
        let _ = server.await;
    }
    info!(
        fetched = IngestMetrics::get(&metrics.fetched),
        recorded = IngestMetrics::get(&metrics.recorded),
        duplicates = IngestMetrics::get(&metrics.duplicates),
        "inbox ingest stopped"
    );
    if let Some(tracing) = tracing {
        tracing.shutdown();
    }
    result?;
    Ok(ExitCode::SUCCESS)
}
