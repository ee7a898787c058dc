//! `outbox demo`: the command-line face of the `outbox-demo` library, which owns the flags and
//! tells the story on stdout; the exit status says whether every guarantee held.

use std::process::ExitCode;

pub async fn run(args: outbox_demo::Args) -> anyhow::Result<ExitCode> {
    let summary = outbox_demo::run(args.options()).await?;
    Ok(if summary.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
