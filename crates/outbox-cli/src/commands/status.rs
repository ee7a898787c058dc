//! `outbox status`: the outbox's health at a glance.

use std::process::ExitCode;

use crate::cli::Format;
use crate::config::DbSettings;

pub async fn run(db: DbSettings, inbox: bool, format: Format) -> anyhow::Result<ExitCode> {
    let (store, place) = super::open_store(&db, inbox).await?;
    let s = store.stats().await?;
    match format {
        Format::Json => println!("{}", serde_json::to_string(&s)?),
        Format::Text => {
            let age = s
                .oldest_pending_age_seconds
                .map_or_else(|| "-".to_string(), |a| format!("{a:.1}s"));
            println!("{:<20}{place}", if inbox { "inbox" } else { "outbox" });
            println!("pending             {}", s.pending);
            println!("oldest pending age  {age}");
            println!("retrying            {}", s.retrying);
            println!("blocked keys        {}", s.blocked_keys);
            println!("parked              {}", s.parked);
            if s.partitions_at_parking_cap > 0 {
                println!(
                    "partitions stopped  {} (parking cap reached: a key is stuck behind a failing message)",
                    s.partitions_at_parking_cap
                );
            }
            println!("failed              {}", s.failed);
            if inbox {
                println!("handled             {}", s.published);
            } else {
                println!("published           {}", s.published);
            }
            println!("relay members       {}", s.members.len());
            for m in &s.members {
                let err = m
                    .sink_error
                    .as_deref()
                    .map(|e| format!("  sink error: {e}"))
                    .unwrap_or_default();
                println!(
                    "  {}  partitions={}  circuit={}  heartbeat={}{err}",
                    m.member,
                    m.partitions,
                    m.circuit,
                    m.heartbeat_at.to_rfc3339()
                );
            }
            if !s.blocked.is_empty() {
                println!(
                    "blocked keys (head message waiting or failed; later messages of the key wait)"
                );
                for b in &s.blocked {
                    println!(
                        "  {}  {} after {} attempt(s): {}",
                        b.key,
                        b.state,
                        b.attempts,
                        b.last_error.as_deref().unwrap_or("-")
                    );
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
