//! `outbox failed` and `outbox redrive`: what gave up, and giving it another budget.

use std::process::ExitCode;

use outbox_core::text::terminal;
use outbox_core::RedriveScope;

use crate::cli::Format;
use crate::config::DbSettings;

/// Lists up to `limit` failed messages with their errors.
pub async fn failed(
    db: DbSettings,
    inbox: bool,
    limit: usize,
    format: Format,
) -> anyhow::Result<ExitCode> {
    let (store, place) = super::open_store(&db, inbox).await?;
    let failed = store.failed(limit).await?;
    match format {
        Format::Json => println!("{}", serde_json::to_string(&failed)?),
        Format::Text => {
            // Keys, types and errors come from rows and brokers: each line goes through the
            // terminal rule, so none of them can act on the operator's terminal.
            let say = |line: String| println!("{}", terminal(&line));
            say(format!("failed messages in {place}: {}", failed.len()));
            for f in &failed {
                say(format!(
                    "  {}  key={}  {}/{}  attempts={}  written {}",
                    f.id,
                    f.aggregate_id,
                    f.aggregate_type,
                    f.event_type,
                    f.attempts,
                    f.created_at.to_rfc3339(),
                ));
                say(format!(
                    "    error: {}",
                    f.last_error.as_deref().unwrap_or("-")
                ));
            }
            if !failed.is_empty() {
                let flag = if inbox { " --inbox" } else { "" };
                say(format!(
                    "redrive with `outbox redrive{flag} --id <id>` or `outbox redrive{flag} --all`"
                ));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Redrives the failed messages `scope` names; exits non-zero when ids were given and none of
/// them was failed.
pub async fn redrive(
    db: DbSettings,
    inbox: bool,
    scope: RedriveScope,
    reason: Option<String>,
) -> anyhow::Result<ExitCode> {
    let (store, place) = super::open_store(&db, inbox).await?;
    let reason = reason.unwrap_or_else(|| {
        let who = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
        format!("outbox redrive by {who}")
    });
    let n = store.redrive(&scope, &reason).await?;
    println!(
        "{}",
        terminal(&format!(
            "redriven {n} message(s) in {place}; recorded in outbox_redrives"
        ))
    );
    match scope {
        RedriveScope::Ids(ids) if n == 0 && !ids.is_empty() => {
            eprintln!("none of the given ids is a failed message (see `outbox failed`)");
            Ok(ExitCode::FAILURE)
        }
        _ => Ok(ExitCode::SUCCESS),
    }
}
