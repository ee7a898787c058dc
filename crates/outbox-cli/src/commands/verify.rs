//! `outbox verify`: the command-line face of the `outbox-verify` library. Turns the profile and
//! flags into settings, runs the checker and prints its report as text or JSON.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use outbox_verify::workload::Shape;
use outbox_verify::Settings;

use crate::cli::{Format, Profile, VerifyArgs};

pub async fn run(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let (d, r, p, rp, k) = match args.profile {
        Profile::Short => (Duration::from_secs(40), 3, 4, 2, 64),
        Profile::Long => (Duration::from_secs(600), 3, 8, 4, 500),
    };
    let keys = args.keys.unwrap_or(k).max(1);
    let shape = Shape {
        producers: args.producers.unwrap_or(p).max(1),
        keys,
        raw_producers: args.raw_producers.unwrap_or(rp),
        raw_keys: (keys / 4).max(2),
    };
    let mut kinds: Vec<String> = Vec::new();
    for f in &args.faults {
        match f.as_str() {
            "kill" | "pause" => kinds.push(f.clone()),
            "broker" if args.broker_stop_cmd.is_some() && args.broker_start_cmd.is_some() => {
                kinds.push(f.clone())
            }
            "db" if args.db_restart_cmd.is_some() => kinds.push(f.clone()),
            "broker" | "db" => {
                eprintln!("verify: fault `{f}` skipped: pass its command (--{f}-…-cmd)")
            }
            other => anyhow::bail!("verify: unknown fault `{other}` (kill, pause, broker, db)"),
        }
    }
    let database_url = args
        .database_url
        .clone()
        .or_else(|| std::env::var("OUTBOX_DATABASE_URL").ok())
        .or_else(|| std::env::var("DATABASE_URL").ok())
        .context("verify needs --database-url (or OUTBOX_DATABASE_URL / DATABASE_URL)")?;
    let outcome = outbox_verify::run(Settings {
        database_url,
        sink_url: args.sink.clone(),
        duration: args.duration.map_or(d, |x| x.0),
        relays: args.relays.unwrap_or(r).max(1),
        shape,
        seed: args.seed.unwrap_or_else(|| fastrand::u64(..)),
        faults: kinds,
        fault_interval: args.fault_interval.0,
        lease: args.lease.0,
        broker_stop: args.broker_stop_cmd.clone(),
        broker_start: args.broker_start_cmd.clone(),
        db_restart: args.db_restart_cmd.clone(),
        keep: args.keep,
        program: std::env::current_exe().context("locating the outbox binary")?,
        announce: args.format == Format::Text,
        through_inbox: args.through_inbox,
    })
    .await?;
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&outcome.report)?),
        Format::Text => outcome.report.print_text(),
    }
    if !outcome.all_faults_injected {
        eprintln!("verify: not every requested fault kind was injected; lengthen --duration or shorten --fault-interval");
    }
    Ok(if outcome.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The handler process of `--through-inbox`: the inbox processor with the verify handler, until
/// SIGINT/SIGTERM.
pub async fn inbox_handler(args: crate::cli::VerifyInboxHandlerArgs) -> anyhow::Result<ExitCode> {
    let url = std::env::var("OUTBOX_DATABASE_URL")
        .context("verify-inbox-handler reads the database URL from OUTBOX_DATABASE_URL")?;
    let shutdown = crate::shutdown::on_signal();
    outbox_verify::inbox::run_handlers(&url, &args.schema, args.lease.0, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}
