//! `outbox relay`: run the relay until SIGINT/SIGTERM.

use std::process::ExitCode;

use std::collections::HashMap;
use std::sync::Arc;

use outbox_core::{Format, Formatted, RouteMatch, Sink};
use outbox_relay::{Relay, Route};
use tracing::info;

use crate::config::RelaySettings;

/// The relay's routes: each rule with its sink connected, then the default sink as a catch-all.
/// Rules naming the same sink URL share one connection.
async fn connect_routes(s: &RelaySettings) -> anyhow::Result<Vec<Route>> {
    let mut connected: HashMap<&str, Arc<dyn Sink>> = HashMap::new();
    let mut routes = Vec::with_capacity(s.routes.len() + 1);
    let rules = s.routes.iter().map(|r| {
        (
            r.name.clone(),
            r.when.clone(),
            &r.sink,
            r.destination.clone(),
            r.envelope.clone(),
        )
    });
    let default = s.sink.as_ref().map(|url| {
        (
            "default".to_string(),
            RouteMatch::default(),
            url,
            None,
            Format::Outbox,
        )
    });
    for (name, when, url, destination, envelope) in rules.chain(default) {
        let sink = match connected.get(url.as_str()) {
            Some(sink) => sink.clone(),
            None => {
                let sink = outbox_sinks::connect(url).await?;
                connected.insert(url, sink.clone());
                sink
            }
        };
        // The format wraps this route's use of the (possibly shared) connection.
        let sink: Arc<dyn Sink> = if envelope.is_outbox() {
            sink
        } else {
            Arc::new(Formatted::new(sink, envelope))
        };
        routes.push(Route {
            name,
            when,
            sink,
            destination,
        });
    }
    Ok(routes)
}

pub async fn run(s: RelaySettings, args: &crate::cli::RelayArgs) -> anyhow::Result<ExitCode> {
    if args.print_config {
        let r = &s.relay;
        let settings = serde_json::json!({
            "mode": format!("{:?}", args.mode).to_lowercase(),
            "cdc_group": (args.mode == crate::cli::RelayMode::Cdc).then_some(&args.cdc_group),
            "database_url": outbox_core::redact::url(&s.db.url),
            "schema": s.db.schema,
            "sink": s.sink.as_deref().map(outbox_core::redact::url),
            "routes": s.routes.iter().map(|rt| serde_json::json!({
                "name": rt.name,
                "aggregate_type": rt.when.aggregate_type.as_ref().map(|g| g.as_str()),
                "event_type": rt.when.event_type.as_ref().map(|g| g.as_str()),
                "topic": rt.when.topic.as_ref().map(|g| g.as_str()),
                "sink": outbox_core::redact::url(&rt.sink),
                "destination": rt.destination.as_ref().map(|d| d.as_str()),
                "envelope": rt.envelope.name(),
                "source": match &rt.envelope {
                    Format::CloudEvents(c) => Some(c.source()),
                    Format::Outbox | Format::Debezium(_) => None,
                },
            })).collect::<Vec<_>>(),
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
            "read_ahead": r.read_ahead,
            "lease": humantime::format_duration(r.lease).to_string(),
            "store_timeout": humantime::format_duration(r.store_timeout).to_string(),
            "max_attempts": r.retry.max_attempts,
            "backoff_base": humantime::format_duration(r.retry.base).to_string(),
            "backoff_max": humantime::format_duration(r.retry.max).to_string(),
            "on_failed": r.on_failed,
            "metrics_addr": s.metrics_addr.map(|a| a.to_string()),
            "unready_after": humantime::format_duration(s.unready_after).to_string(),
        });
        println!("{}", serde_json::to_string_pretty(&settings)?);
        return Ok(ExitCode::SUCCESS);
    }
    // The console's settings are checked before anything connects: a console that would be
    // open to the network stops the relay at once, with the reason.
    let console_options = args.console.map(console_options).transpose()?;
    // Installed before anything registers a metric, and bound before anything connects: an
    // address in use is reported at once.
    let observe = match s.metrics_addr {
        Some(addr) => Some(crate::observe::start(addr, &crate::observe::RELAY_METRICS).await?),
        None => None,
    };
    // Pool: each worker claims and marks on its own, plus LISTEN and lease renewals, plus
    // the scrape's query and the readiness probe's round trip.
    let pool_size = (s.relay.workers as u32) * 2 + 2 + u32::from(observe.is_some());
    let database =
        outbox_db::open_with_deadline(&s.db.url, &s.db.schema, pool_size, s.relay.store_timeout)
            .await?;
    // Fail fast, with the fix in the message, when the tables are missing or of another
    // version.
    database.check().await?;
    let mut s = s;
    let store = match args.mode {
        crate::cli::RelayMode::Polling => database.store(),
        crate::cli::RelayMode::Cdc => {
            let heartbeat = args.cdc_heartbeat.map(|d| d.0);
            let max_retained = args.cdc_max_retained_wal.map(|b| b.0 as u64);
            let park_after = args
                .cdc_park_after
                .map_or(outbox_db::DEFAULT_PARK_AFTER, |d| d.0);
            cdc_store(
                &database,
                &s.db.url,
                &args.cdc_group,
                (heartbeat, max_retained, park_after),
                &mut s.relay,
            )
            .await?
        }
    };
    let routes = connect_routes(&s).await?;
    info!(database = %outbox_core::redact::url(&s.db.url), outbox = %database.place(),
          sink = %s.sink.as_deref().map(outbox_core::redact::url).unwrap_or_default(),
          routes = s.routes.len(), "relay configured");
    let tracing = match &args.otlp_endpoint {
        Some(url) => Some(outbox_observe::install_tracing(url, "outbox-relay")?),
        None => None,
    };
    let shutdown = crate::shutdown::on_signal();
    let console = match console_options {
        Some(options) => Some(start_console(options, &s, store.clone(), &shutdown).await?),
        None => None,
    };
    let relay = Relay::with_routes(store.clone(), routes, s.relay)?;
    let server = observe.map(|o| {
        let target = outbox_observe::Target::relay(store, relay.health(), s.unready_after)
            .with_routes(s.routes.clone());
        o.serve(target, shutdown.clone())
    });
    relay.run(shutdown.clone()).await;
    shutdown.cancel();
    if let Some(server) = server {
        let _ = server.await;
    }
    if let Some(console) = console {
        let _ = console.await;
    }
    if let Some(tracing) = tracing {
        tracing.shutdown();
    }
    Ok(ExitCode::SUCCESS)
}

/// `--mode cdc`: the store that reads the group's replication slot. One worker reads it (the
/// slot has one reader at a time), woken by the stream; nothing polls.
async fn cdc_store(
    database: &outbox_db::Database,
    url: &str,
    group: &str,
    (heartbeat, max_retained, park_after): (
        Option<std::time::Duration>,
        Option<u64>,
        std::time::Duration,
    ),
    relay: &mut outbox_relay::RelayConfig,
) -> anyhow::Result<Arc<dyn outbox_core::Store>> {
    let options = outbox_db::CdcOptions {
        heartbeat,
        max_retained,
        park_after,
    };
    let (store, names) = database.cdc_store(url, group, options).await?;
    if relay.workers != 1 {
        info!(
            workers = relay.workers,
            "CDC mode reads its slot with one worker; --workers is ignored"
        );
    }
    relay.workers = 1;
    relay.listen = true;
    relay.read_ahead = false;
    info!(slot = %names.slot, publication = %names.publication, "relay reads the WAL (CDC mode)");
    Ok(store)
}

/// The options of `--console ADDR`: the console's own defaults and environment
/// (`OUTBOX_CONSOLE_TOKEN`, `OUTBOX_CONSOLE_ALLOWED_HOSTS`), listening on `listen`, checked.
fn console_options(listen: std::net::SocketAddr) -> anyhow::Result<outbox_console::Options> {
    use clap::Parser as _;
    #[derive(clap::Parser)]
    struct Defaults {
        #[command(flatten)]
        options: outbox_console::Options,
    }
    let mut options = Defaults::try_parse_from(["console"])?.options;
    options.listen = listen;
    options
        .validate()
        .map_err(|e| crate::config::ConfigError(format!("--console: {e}")))?;
    Ok(options)
}

/// `--console`: the web console over the relay's own store, bound before the relay starts so
/// an address in use is reported at once.
async fn start_console(
    options: outbox_console::Options,
    s: &RelaySettings,
    store: Arc<dyn outbox_core::Store>,
    stop: &tokio_util::sync::CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let bound = outbox_console::bind(options.listen).await?;
    let why = "the relay's console shows the outbox only: `outbox console` shows the inbox too";
    let side = outbox_console::Side {
        store,
        place: outbox_core::redact::url(&s.db.url),
    };
    let console =
        outbox_console::Console::new(side, Err(why.into()), s.routes.clone(), &options, stop);
    Ok(tokio::spawn(outbox_console::serve(
        bound,
        console,
        stop.clone(),
    )))
}
