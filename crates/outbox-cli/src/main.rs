//! The `outbox` binary: `migrate`, `relay`, `status` and `bench` over a PostgreSQL outbox.

mod cli;
mod commands;
mod config;
mod shutdown;

use std::process::ExitCode;

use clap::Parser;

/// Exit status for a configuration problem (bad flag, file or environment value).
const EXIT_CONFIG: u8 = 2;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    // Commands that print a story or a report keep the relay's own log lines quiet unless
    // asked (OUTBOX_LOG / RUST_LOG); the relay logs at info.
    let default_filter = match cli.command {
        cli::Command::Demo(_) => "error",
        cli::Command::Bench(_)
        | cli::Command::Verify(_)
        | cli::Command::Status(_)
        | cli::Command::Migrate(_)
        | cli::Command::Maintain(_)
        | cli::Command::Purge(_) => "warn,sqlx=error",
        // sqlx warns about each broken pooled connection during a database restart; the relay
        // reports the outage itself, once per backoff step.
        cli::Command::Relay(_) => "info,sqlx=error",
    };
    init_tracing(&cli.log_format, default_filter);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(code) => code,
        Err(err) => {
            let config = err
                .downcast_ref::<outbox_core::Error>()
                .is_some_and(|e| e.kind() == outbox_core::ErrorKind::Config)
                || err.downcast_ref::<config::ConfigError>().is_some();
            eprintln!(
                "error: {}",
                outbox_core::redact::sanitize(&format!("{err:#}"))
            );
            if config {
                ExitCode::from(EXIT_CONFIG)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn init_tracing(format: &str, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("OUTBOX_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}
