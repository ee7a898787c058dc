//! `outbox bench`: the command-line face of the `outbox-bench` library, which owns the flags
//! and prints its report as it goes; with `--format json` the figures follow as JSON.

use std::process::ExitCode;

pub async fn run(args: outbox_bench::Args) -> anyhow::Result<ExitCode> {
    let options = args.options();
    let json = options.json;
    let report = outbox_bench::run(options).await?;
    if json {
        println!("{}", report.json());
    }
    Ok(ExitCode::SUCCESS)
}
