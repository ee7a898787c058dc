//! `outbox verify`: the command-line face of the `outbox-verify` library, which owns the flags;
//! runs the checker and prints its report as text or JSON.

use std::process::ExitCode;

use anyhow::Context as _;
use outbox_verify::Format;

pub async fn run(args: outbox_verify::Args) -> anyhow::Result<ExitCode> {
    let program = std::env::current_exe().context("locating the outbox binary")?;
    let outcome = outbox_verify::run(args.settings(program)?).await?;
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&outcome.report)?),
        Format::Text => outcome.report.print_text(),
    }
    if !outcome.all_faults_injected {
        eprintln!(
            "verify: not every requested fault kind was injected; lengthen --duration or \
             shorten --fault-interval"
        );
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
