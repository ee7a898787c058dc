//! The `outbox` binary: parses arguments and configuration, calls the libraries that do the work
//! (relay, inbox, verify, bench, demo), and prints what they return.

mod cli;
mod commands;
mod config;
mod observe;
mod shutdown;
mod view;

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
        | cli::Command::Purge(_)
        | cli::Command::Failed(_)
        | cli::Command::Redrive(_) => "warn,sqlx=error",
        // sqlx warns about each broken pooled connection during a database restart; the relay
        // reports the outage itself, once per backoff step.
        cli::Command::Relay(_)
        | cli::Command::Inbox(_)
        | cli::Command::Console(_)
        | cli::Command::VerifyInboxHandler(_) => "info,sqlx=error",
    };
    init_tracing(&cli.log_format, default_filter);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    // A CDC relay is one stream read by one worker: a second runtime thread only adds wake-ups
    // from one thread to the other. Measured at a steady 1,000 events/s: the relay's CPU
    // 10.0–12.6% of a core on two threads, 9.1–9.6% on one, and the same drain rate against
    // the polling relay (docs/performance.md, CDC).
    if let cli::Command::Relay(args) = &cli.command {
        if args.mode == cli::RelayMode::Cdc {
            builder.worker_threads(1);
        }
    }
    let runtime = match builder.enable_all().build() {
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
            // An error may quote a row or a broker's answer: masked, then shown through the
            // terminal rule.
            let text = outbox_core::redact::sanitize(&causes(&err));
            eprintln!("error: {}", outbox_core::text::terminal(&text));
            if config {
                ExitCode::from(EXIT_CONFIG)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// The error and its causes, each said once: an outbox error already carries the text of the
/// error it wraps, so a cause whose text an earlier one holds is left out.
fn causes(err: &anyhow::Error) -> String {
    let mut said: Vec<String> = Vec::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if !said.iter().any(|s| s.contains(&text)) {
            said.push(text);
        }
    }
    said.join(": ")
}

fn init_tracing(format: &str, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("OUTBOX_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    // Colours only for a terminal: a log file or a pipe gets plain text, so an ESC in it can
    // only have come from data, and the terminal rule below shows that one by name.
    // A log line that cannot be written (stderr closed: a pipe whose reader went away) is
    // dropped; by default the subscriber reports it with eprintln!, which panics the task that
    // logged, and a signal handler that panics so never stops the process.
    let builder = tracing_subscriber::fmt()
        .log_internal_errors(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(filter)
        .with_writer(|| MaskingWriter(std::io::stderr()));
    if format == "json" {
        builder.json().init();
    } else {
        builder.fmt_fields(terminal_fields()).init();
    }
}

/// How the text log format writes an event's fields: `name=value`, space-separated, the
/// message bare, each value through the terminal rule (`outbox_core::text`). A key, a type or a
/// broker's error logged from a row then cannot move the cursor, clear the screen or reorder
/// the line of whoever tails the log (tracing-subscriber escapes ESC in messages only).
fn terminal_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + 'static {
    use outbox_core::text::Terminal;
    use tracing_subscriber::field::MakeExt as _;
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let value = Terminal(format_args!("{value:?}"));
        match field.name() {
            "message" => write!(w, "{value}"),
            name => write!(w, "{}={value}", name.strip_prefix("r#").unwrap_or(name)),
        }
    })
    .delimited(" ")
}

/// A log writer that masks secrets (URL userinfo, secret parameters) in every line before it
/// reaches `W`. The relay's own log fields are masked where they are made; this catches a
/// dependency that logs a URL it was handed. The fmt layer writes each event with one
/// `write_all`, so a line is masked whole.
struct MaskingWriter<W: std::io::Write>(W);

impl<W: std::io::Write> std::io::Write for MaskingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let masked = outbox_core::redact::mask_secrets(&String::from_utf8_lossy(buf));
        self.0.write_all(masked.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::MaskingWriter;

    #[test]
    fn log_lines_are_masked_before_they_are_written() {
        let mut w = MaskingWriter(Vec::new());
        w.write_all(
            b"\x1b[2mDEBUG\x1b[0m connecting server=nats://T0KEN@127.0.0.1:4222 url=https://h/x?X-Amz-Signature=abc\n",
        )
        .unwrap_or_default();
        let out = String::from_utf8(w.0).unwrap_or_default();
        assert_eq!(
            out,
            "\x1b[2mDEBUG\x1b[0m connecting server=nats://***@127.0.0.1:4222 url=https://h/x?X-Amz-Signature=***\n"
        );
    }
}
