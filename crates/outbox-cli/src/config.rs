//! Settings: `outbox.toml`, then `OUTBOX_…` environment variables, then flags, each layer
//! overriding the one before. Unknown keys and bad values are errors that name the key and
//! where it came from (file path, variable or flag).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use outbox_core::options::{self, Bounds, Shown as _};
pub use outbox_core::options::{Dur, Size as ByteSize};
use outbox_core::route::RouteBuilder;
use outbox_core::{
    DestinationPattern, DestinationRules, DestinationTemplate, OnFailed, RetryPolicy, RouteSpec,
};
use outbox_relay::RelayConfig;
use serde::Deserialize;

use crate::cli::{DbArgs, RelayArgs};

/// Default config file, read when present.
pub const DEFAULT_CONFIG_FILE: &str = "outbox.toml";

/// A configuration problem; the message names the key and its source.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

type Result<T> = std::result::Result<T, ConfigError>;

/// The file: every key optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Database URL.
    pub database_url: Option<String>,
    /// Schema of the outbox tables.
    pub schema: Option<String>,
    /// `[relay]` section.
    #[serde(default)]
    pub relay: RelaySection,
    /// `[inbox]` section.
    #[serde(default)]
    pub inbox: InboxSection,
}

/// `[inbox]` in `outbox.toml`; see `outbox inbox --help` for each key's meaning.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InboxSection {
    /// Source URL.
    pub source: Option<String>,
    /// Messages per batch.
    pub batch_size: Option<usize>,
    /// Longest idle wait between fetches.
    pub poll_interval: Option<Dur>,
    /// How long processed inbox rows and claims are kept.
    pub retention: Option<Dur>,
    /// Address of /metrics, /livez and /readyz.
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// `[relay]` in `outbox.toml`; see `outbox relay --help` for each key's meaning.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelaySection {
    /// Sink URL.
    pub sink: Option<String>,
    /// Destination template.
    pub destination: Option<String>,
    /// Rows per claim.
    pub batch_size: Option<usize>,
    /// Payload bytes per claim.
    pub batch_bytes: Option<ByteSize>,
    /// Worker tasks per process.
    pub workers: Option<usize>,
    /// Poll interval.
    pub poll_interval: Option<Dur>,
    /// LISTEN/NOTIFY wake-ups (needs `outbox migrate --notify`).
    pub listen: Option<bool>,
    /// Read the next batch while a full one is published.
    pub read_ahead: Option<bool>,
    /// How long passed storage is kept.
    pub retention: Option<Dur>,
    /// How often the relay maintains storage; 0 turns it off.
    pub maintain_every: Option<Dur>,
    /// Partition lease.
    pub lease: Option<Dur>,
    /// Deadline of each store call a relay worker makes.
    pub store_timeout: Option<Dur>,
    /// Attempts before `failed`.
    pub max_attempts: Option<u32>,
    /// First retry delay.
    pub backoff_base: Option<Dur>,
    /// Longest retry delay.
    pub backoff_max: Option<Dur>,
    /// `block` or `skip`: what a failed message means for the rest of its key.
    pub on_failed: Option<OnFailed>,
    /// NATS-style patterns (`orders.>`, `payments.*.created`) confining every destination; a
    /// row rendering outside them ends `failed`.
    pub allow_destinations: Option<Vec<String>>,
    /// `[[relay.routes]]`: routing rules, first match wins.
    pub routes: Option<Vec<RouteSection>>,
    /// Address of /metrics, /livez and /readyz.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// How long every sink's circuit may be open before /readyz fails.
    pub unready_after: Option<Dur>,
}

/// One `[[relay.routes]]` table; see `outbox relay --help` (`--route`) for each key.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSection {
    /// Name for logs and status.
    pub name: Option<String>,
    /// Glob over `aggregate_type`.
    pub aggregate_type: Option<String>,
    /// Glob over `event_type`.
    pub event_type: Option<String>,
    /// Glob over `topic`.
    pub topic: Option<String>,
    /// Sink URL (required).
    pub sink: Option<String>,
    /// Destination template.
    pub destination: Option<String>,
    /// Envelope format: `outbox` (default), `cloudevents`, `cloudevents-structured`.
    pub envelope: Option<String>,
    /// CloudEvents `source` (a URI-reference).
    pub source: Option<String>,
    /// With `envelope = "debezium"`: the Event Router's options by their own names
    /// (`"route.by.field" = "type"`, …).
    pub debezium: Option<std::collections::BTreeMap<String, String>>,
}

impl RouteSection {
    fn spec(&self, index: usize) -> outbox_core::Result<RouteSpec> {
        let mut b = RouteBuilder::new(index);
        for (key, value) in [
            ("name", &self.name),
            ("aggregate_type", &self.aggregate_type),
            ("event_type", &self.event_type),
            ("topic", &self.topic),
            ("sink", &self.sink),
            ("destination", &self.destination),
            ("envelope", &self.envelope),
            ("source", &self.source),
        ] {
            if let Some(v) = value {
                b.set(key, v)?;
            }
        }
        for (key, value) in self.debezium.iter().flatten() {
            if !(key.starts_with("route.") || key.starts_with("table.")) {
                return Err(outbox_core::Error::config(format!(
                    "route {index}: debezium.`{key}` is not an Event Router option (route.*, \
                     table.*)"
                )));
            }
            b.set(key, value)?;
        }
        b.build()
    }
}

/// A loaded file and where it came from.
pub struct Loaded {
    file: FileConfig,
    path: Option<PathBuf>,
}

/// Reads `explicit`, else `$OUTBOX_CONFIG`, else `./outbox.toml` when it exists.
pub fn load(explicit: Option<&Path>) -> Result<Loaded> {
    let env_path = std::env::var_os("OUTBOX_CONFIG").map(PathBuf::from);
    let (path, required) = match (explicit, env_path) {
        (Some(p), _) => (p.to_path_buf(), true),
        (None, Some(p)) => (p, true),
        (None, None) => (PathBuf::from(DEFAULT_CONFIG_FILE), false),
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Loaded {
                file: FileConfig::default(),
                path: None,
            })
        }
        Err(e) => return Err(ConfigError(format!("config file {}: {e}", path.display()))),
    };
    let file: FileConfig = toml::from_str(&text).map_err(|e| {
        ConfigError(format!(
            "config file {}: {}",
            path.display(),
            e.to_string().trim_end()
        ))
    })?;
    Ok(Loaded {
        file,
        path: Some(path),
    })
}

impl Loaded {
    fn file_key(&self, key: &str) -> String {
        match &self.path {
            Some(p) => format!("`{key}` in {}", p.display()),
            None => format!("`{key}`"),
        }
    }
}

/// One setting resolved from flag, environment, file or default.
fn pick<T: FromStr>(flag: Option<T>, env: &[&str], file: Option<T>) -> Result<Option<T>>
where
    T::Err: std::fmt::Display,
{
    if flag.is_some() {
        return Ok(flag);
    }
    for name in env {
        if let Ok(raw) = std::env::var(name) {
            return raw
                .parse::<T>()
                .map(Some)
                .map_err(|e| ConfigError(format!("environment variable {name}=`{raw}`: {e}")));
        }
    }
    Ok(file)
}

/// A boolean from environment variable `name` (in the one grammar of `outbox_core::options`:
/// true/false, yes/no, on/off, 1/0), else from the file.
fn pick_bool(name: &str, file: Option<bool>) -> Result<Option<bool>> {
    match std::env::var(name) {
        Ok(raw) => options::parse_bool(&raw).map(Some).map_err(|expected| {
            ConfigError(format!(
                "environment variable {name}=`{raw}`: expected {expected}"
            ))
        }),
        Err(_) => Ok(file),
    }
}

/// Where the outbox lives.
#[derive(Debug, Clone)]
pub struct DbSettings {
    /// Database URL (may contain a password: print it only through `redact::url`).
    pub url: String,
    /// Schema name (validated by the store).
    pub schema: String,
}

/// Resolves the database settings for any command.
pub fn db(loaded: &Loaded, args: &DbArgs) -> Result<DbSettings> {
    let url = pick(args.database_url.clone(), &["OUTBOX_DATABASE_URL", "DATABASE_URL"], loaded.file.database_url.clone())?
        .ok_or_else(|| {
            ConfigError(
                "no database URL: pass --database-url, set DATABASE_URL, or write database_url in outbox.toml".into(),
            )
        })?;
    let schema = pick(
        args.schema.clone(),
        &["OUTBOX_SCHEMA"],
        loaded.file.schema.clone(),
    )?
    .unwrap_or_else(|| "public".to_string());
    outbox_db::check_schema_name(&url, &schema).map_err(|e| ConfigError(format!("schema: {e}")))?;
    Ok(DbSettings { url, schema })
}

/// Everything `outbox relay` needs.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// Database.
    pub db: DbSettings,
    /// Default sink URL: rows no route matches. `None` only when routes are configured.
    pub sink: Option<String>,
    /// Routing rules, first match wins.
    pub routes: Vec<RouteSpec>,
    /// Engine settings.
    pub relay: RelayConfig,
    /// Where to serve /metrics, /livez and /readyz (`None`: not at all).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// How long every sink's circuit may be open before /readyz fails.
    pub unready_after: Duration,
}

/// Everything `outbox inbox` needs.
#[derive(Debug, Clone)]
pub struct InboxSettings {
    /// Database.
    pub db: DbSettings,
    /// Source URL (may contain a password).
    pub source: String,
    /// Daemon settings.
    pub daemon: outbox_inbox::daemon::DaemonConfig,
    /// Where to serve /metrics, /livez and /readyz (`None`: not at all).
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// Resolves `outbox inbox` settings.
pub fn inbox(loaded: &Loaded, args: &crate::cli::InboxArgs) -> Result<InboxSettings> {
    let f = &loaded.file.inbox;
    let db = db(loaded, &args.db)?;
    let source = pick(
        args.source.clone(),
        &["OUTBOX_INBOX_SOURCE"],
        f.source.clone(),
    )?
    .ok_or_else(|| {
        ConfigError(
            "no source: pass --source (e.g. nats://127.0.0.1:4222?stream=ORDERS), set \
                 OUTBOX_INBOX_SOURCE, or write source in [inbox] of outbox.toml"
                .into(),
        )
    })?;
    // Before anything connects: a misspelt source is reported before an unreachable database.
    outbox_inbox::source::check(&source).map_err(|e| ConfigError(e.to_string()))?;
    let defaults = outbox_inbox::daemon::DaemonConfig::default();
    let batch = pick(args.batch_size, &["OUTBOX_INBOX_BATCH_SIZE"], f.batch_size)?
        .unwrap_or(defaults.batch);
    if batch == 0 || batch > 10_000 {
        return Err(ConfigError(format!(
            "inbox batch size {batch}: use 1 to 10000 ({})",
            loaded.file_key("inbox.batch_size")
        )));
    }
    let poll = pick(
        args.poll_interval,
        &["OUTBOX_INBOX_POLL_INTERVAL"],
        f.poll_interval,
    )?
    .map_or(defaults.poll_interval, |d| d.0);
    let retention = pick(args.retention, &["OUTBOX_INBOX_RETENTION"], f.retention)?
        .map_or(defaults.retention, |d| d.0);
    let metrics_addr = pick(
        args.metrics_addr,
        &["OUTBOX_INBOX_METRICS_ADDR"],
        f.metrics_addr,
    )?;
    Ok(InboxSettings {
        db,
        metrics_addr,
        source,
        daemon: outbox_inbox::daemon::DaemonConfig {
            batch,
            poll_interval: poll,
            retention,
        },
    })
}

/// Resolves the retention for `outbox maintain`: flag, then `OUTBOX_RETENTION`, then
/// `[relay] retention`, then the default (7 days).
pub fn retention(loaded: &Loaded, flag: Option<Dur>) -> Result<Duration> {
    Ok(
        pick(flag, &["OUTBOX_RETENTION"], loaded.file.relay.retention)?
            .map_or(RelayConfig::default().retention, |d| d.0),
    )
}

/// The routing rules of `[[relay.routes]]` in the file (`outbox status` groups its backlog by
/// them; the relay's `--route` flags replace them).
pub fn file_routes(loaded: &Loaded) -> Result<Vec<RouteSpec>> {
    let routes = loaded.file.relay.routes.iter().flatten().enumerate();
    routes
        .map(|(i, r)| r.spec(i + 1))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| ConfigError(format!("{}: {e}", loaded.file_key("relay.routes"))))
}

/// The routing rules: the `--route` flags when any are given, else `[[relay.routes]]` of the
/// file. The relay routes by them; `outbox status` and `outbox console` group the backlog by
/// them, so they take the same flags.
pub fn routes(loaded: &Loaded, flags: &[String]) -> Result<Vec<RouteSpec>> {
    if flags.is_empty() {
        return file_routes(loaded);
    }
    flags
        .iter()
        .enumerate()
        .map(|(i, r)| RouteSpec::parse(r, i + 1))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| ConfigError(format!("--route: {e}")))
}

/// Resolves `outbox relay` settings and checks every value.
pub fn relay(loaded: &Loaded, args: &RelayArgs) -> Result<RelaySettings> {
    let f = &loaded.file.relay;
    let db = db(loaded, &args.db)?;
    let routes = routes(loaded, &args.route)?;
    let sink = pick(args.sink.clone(), &["OUTBOX_SINK"], f.sink.clone())?;
    if sink.is_none() && routes.is_empty() {
        return Err(ConfigError("no sink: pass --sink (e.g. nats://127.0.0.1:4222), set OUTBOX_SINK, or write [relay] sink (or routes)".into()));
    }
    let mut names = std::collections::HashSet::new();
    for r in &routes {
        if !names.insert(r.name.as_str()) {
            return Err(ConfigError(format!(
                "route `{}` is named twice; route names must differ",
                r.name
            )));
        }
    }
    let (destination, destination_rules) = destinations(loaded, args, &routes)?;
    let defaults = RelayConfig::default();
    let batch_size =
        pick(args.batch_size, &["OUTBOX_BATCH_SIZE"], f.batch_size)?.unwrap_or(defaults.batch_size);
    check(
        batch_size,
        1,
        10_000,
        &loaded.file_key("relay.batch_size"),
        "batch size",
    )?;
    let batch_bytes = pick(args.batch_bytes, &["OUTBOX_BATCH_BYTES"], f.batch_bytes)?
        .map_or(defaults.batch_bytes, |b| b.0);
    check(
        batch_bytes,
        1 << 10,
        1 << 30,
        &loaded.file_key("relay.batch_bytes"),
        "batch bytes",
    )?;
    let workers = pick(args.workers, &["OUTBOX_WORKERS"], f.workers)?.unwrap_or(defaults.workers);
    check(workers, 1, 64, &loaded.file_key("relay.workers"), "workers")?;
    let poll_interval = pick(
        args.poll_interval,
        &["OUTBOX_POLL_INTERVAL"],
        f.poll_interval,
    )?
    .map_or(defaults.poll_interval, |d| d.0);
    at_least(poll_interval, Duration::from_millis(10), "poll interval")?;
    at_most(poll_interval, Duration::from_secs(3600), "poll interval")?;
    let listen = if args.no_listen {
        false
    } else if args.listen {
        true
    } else {
        pick_bool("OUTBOX_LISTEN", f.listen)?.unwrap_or(defaults.listen)
    };
    let read_ahead = !args.no_read_ahead
        && pick_bool("OUTBOX_READ_AHEAD", f.read_ahead)?.unwrap_or(defaults.read_ahead);
    let retention = pick(args.retention, &["OUTBOX_RETENTION"], f.retention)?
        .map_or(defaults.retention, |d| d.0);
    let maintain_every = pick(
        args.maintain_every,
        &["OUTBOX_MAINTAIN_EVERY"],
        f.maintain_every,
    )?
    .map_or(defaults.maintain_every, |d| d.0);
    at_most(
        maintain_every,
        Duration::from_secs(86_400),
        "maintain every",
    )?;
    let lease = pick(args.lease, &["OUTBOX_LEASE"], f.lease)?.map_or(defaults.lease, |d| d.0);
    at_least(lease, Duration::from_millis(500), "lease")?;
    at_most(lease, Duration::from_secs(3600), "lease")?;
    check_sinks(sink.as_ref(), &routes, lease)?;
    let store_timeout = pick(
        args.store_timeout,
        &["OUTBOX_STORE_TIMEOUT"],
        f.store_timeout,
    )?
    .map_or(defaults.store_timeout, |d| d.0);
    at_least(store_timeout, Duration::from_millis(100), "store timeout")?;
    at_most(store_timeout, Duration::from_secs(3600), "store timeout")?;
    let max_attempts = pick(args.max_attempts, &["OUTBOX_MAX_ATTEMPTS"], f.max_attempts)?
        .unwrap_or(defaults.retry.max_attempts);
    check(
        max_attempts as usize,
        1,
        1_000_000,
        &loaded.file_key("relay.max_attempts"),
        "max attempts",
    )?;
    let base = pick(args.backoff_base, &["OUTBOX_BACKOFF_BASE"], f.backoff_base)?
        .map_or(defaults.retry.base, |d| d.0);
    let max = pick(args.backoff_max, &["OUTBOX_BACKOFF_MAX"], f.backoff_max)?
        .map_or(defaults.retry.max, |d| d.0);
    let on_failed = pick(args.on_failed, &["OUTBOX_ON_FAILED"], f.on_failed)?.unwrap_or_default();
    at_most(max, Duration::from_secs(86_400), "backoff max")?;
    if base > max {
        return Err(ConfigError(format!(
            "backoff base {base:?} is longer than backoff max {max:?}"
        )));
    }
    let metrics_addr = pick(args.metrics_addr, &["OUTBOX_METRICS_ADDR"], f.metrics_addr)?;
    let unready_after = pick(
        args.unready_after,
        &["OUTBOX_UNREADY_AFTER"],
        f.unready_after,
    )?
    .map_or(outbox_observe::DEFAULT_UNREADY_AFTER, |d| d.0);
    at_most(unready_after, Duration::from_secs(86_400), "unready after")?;
    Ok(RelaySettings {
        db,
        metrics_addr,
        unready_after,
        sink,
        routes,
        relay: RelayConfig {
            batch_size,
            batch_bytes,
            workers,
            poll_interval,
            listen,
            retention,
            maintain_every,
            lease,
            store_timeout,
            retry: RetryPolicy {
                max_attempts,
                base,
                max,
            },
            destination,
            destination_rules,
            on_failed,
            breaker_threshold: defaults.breaker_threshold,
            member_prefix: member_prefix(),
            read_ahead,
        },
    })
}

/// The default destination template and the allow-list every template (the default's and
/// each route's) is checked against.
fn destinations(
    loaded: &Loaded,
    args: &RelayArgs,
    routes: &[RouteSpec],
) -> Result<(DestinationTemplate, DestinationRules)> {
    let f = &loaded.file.relay;
    let destination = pick(
        args.destination.clone(),
        &["OUTBOX_DESTINATION"],
        f.destination.clone(),
    )?;
    let destination = match destination {
        Some(t) => {
            DestinationTemplate::parse(&t).map_err(|e| ConfigError(format!("destination: {e}")))?
        }
        None => DestinationTemplate::default(),
    };
    // A list: the flag (repeated or comma-separated), else OUTBOX_ALLOW_DESTINATIONS as a
    // comma list, else the file's array.
    let (allow, allow_source) = if !args.allow_destinations.is_empty() {
        (
            args.allow_destinations.clone(),
            "--allow-destinations".to_string(),
        )
    } else if let Ok(raw) = std::env::var("OUTBOX_ALLOW_DESTINATIONS") {
        (
            raw.split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect(),
            "environment variable OUTBOX_ALLOW_DESTINATIONS".to_string(),
        )
    } else {
        (
            f.allow_destinations.clone().unwrap_or_default(),
            loaded.file_key("relay.allow_destinations"),
        )
    };
    let patterns = allow
        .iter()
        .map(|p| DestinationPattern::parse(p))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| ConfigError(format!("{allow_source}: {e}")))?;
    let destination_rules = DestinationRules::allow(patterns);
    destination_rules
        .check_template(&destination)
        .map_err(|e| ConfigError(e.to_string()))?;
    for r in routes {
        if let Some(t) = &r.destination {
            destination_rules
                .check_template(t)
                .map_err(|e| ConfigError(format!("route `{}`: {e}", r.name)))?;
        }
    }
    Ok((destination, destination_rules))
}

/// Checks every sink URL before anything connects (a misspelt scheme is reported before an
/// unreachable database). A relay must be able to wait for an acknowledgement and still hold its
/// lease: each sink's ack timeout has to fit in a third of the lease.
fn check_sinks(sink: Option<&String>, routes: &[RouteSpec], lease: Duration) -> Result<()> {
    for url in sink.into_iter().chain(routes.iter().map(|r| &r.sink)) {
        outbox_sinks::check(url).map_err(|e| ConfigError(e.to_string()))?;
        if let Some(ack) = outbox_sinks::ack_timeout(url).map_err(|e| ConfigError(e.to_string()))? {
            RelayConfig {
                lease,
                ..RelayConfig::default()
            }
            .check_ack_timeout(ack)
            .map_err(ConfigError)?;
        }
    }
    Ok(())
}

fn check(v: usize, min: usize, max: usize, key: &str, what: &str) -> Result<()> {
    if v < min || v > max {
        return Err(ConfigError(format!(
            "{what} {v} is out of range {min}..={max} (flag, environment or {key})"
        )));
    }
    Ok(())
}

fn at_most(v: Duration, max: Duration, what: &str) -> Result<()> {
    within(v, Bounds::new(Duration::ZERO, max), what)
}

fn at_least(v: Duration, min: Duration, what: &str) -> Result<()> {
    within(v, Bounds::new(min, Duration::MAX), what)
}

/// One text for a duration setting out of its bounds, the bound written as a user writes it.
fn within(v: Duration, bounds: Bounds<Duration>, what: &str) -> Result<()> {
    bounds
        .check(v)
        .map(|_| ())
        .map_err(|expected| ConfigError(format!("{what} `{}`: expected {expected}", v.shown())))
}

/// `host-pid`, so `outbox status` shows which process owns what.
fn member_prefix() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let host = if host.is_empty() {
        "relay".to_string()
    } else {
        host
    };
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_name_the_key_and_file() {
        let dir = std::env::temp_dir().join(format!("outbox-cfg-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("outbox.toml");
        std::fs::write(
            &path,
            "database_url = \"postgres://x\"\n[relay]\nbatch_sise = 5\n",
        )
        .unwrap();
        let err = load(Some(&path)).err().unwrap().to_string();
        assert!(err.contains("batch_sise"), "{err}");
        assert!(err.contains(&path.display().to_string()), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        assert_eq!("16MiB".parse::<ByteSize>().unwrap().0, 16 << 20);
        assert_eq!("512KiB".parse::<ByteSize>().unwrap().0, 512 << 10);
        assert_eq!("2MB".parse::<ByteSize>().unwrap().0, 2_000_000);
        assert_eq!("1048576".parse::<ByteSize>().unwrap().0, 1 << 20);
        assert!("lots".parse::<ByteSize>().unwrap_err().contains("lots"));
        assert!("16 furlongs".parse::<ByteSize>().is_err());
        let f: FileConfig = toml::from_str("[relay]\nbatch_bytes = 4096\n").unwrap();
        assert_eq!(f.relay.batch_bytes, Some(ByteSize(4096)));
        let f: FileConfig = toml::from_str("[relay]\nbatch_bytes = \"1MiB\"\n").unwrap();
        assert_eq!(f.relay.batch_bytes, Some(ByteSize(1 << 20)));
    }

    #[test]
    fn file_routes_take_envelopes_and_the_event_routers_options() {
        let f: FileConfig = toml::from_str(
            "[[relay.routes]]\nsink = \"stdout:\"\nenvelope = \"cloudevents-structured\"\n\
             source = \"urn:shop\"\n\
             [[relay.routes]]\nsink = \"kafka://k:9092\"\nenvelope = \"debezium\"\n\
             [relay.routes.debezium]\n\"route.by.field\" = \"type\"\n",
        )
        .unwrap();
        let routes = f.relay.routes.unwrap();
        let ce = routes[0].spec(1).unwrap();
        assert_eq!(ce.envelope.name(), "cloudevents-structured");
        let dbz = routes[1].spec(2).unwrap();
        assert_eq!(dbz.envelope.name(), "debezium");
        assert_eq!(
            dbz.destination.unwrap().as_str(),
            "outbox.event.{event_type}"
        );
        let bad: FileConfig = toml::from_str(
            "[[relay.routes]]\nsink = \"stdout:\"\nenvelope = \"debezium\"\n\
             [relay.routes.debezium]\nname = \"x\"\n",
        )
        .unwrap();
        let err = bad.relay.routes.unwrap()[0]
            .spec(1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not an Event Router option"), "{err}");
    }

    #[test]
    fn durations_parse_and_bad_ones_say_why() {
        assert_eq!(
            "250ms".parse::<Dur>().unwrap().0,
            Duration::from_millis(250)
        );
        assert!("soon".parse::<Dur>().unwrap_err().contains("soon"));
    }
}
