//! Steady mode on MySQL/MariaDB: producers commit one row per transaction at `--rate` through the
//! MySQL writer while the relay (polling: MySQL has no notifications) drains to NATS; commit→ack
//! is measured at the broker for every message, and the CPU each message cost the relay, the
//! database server and the broker over the same stretch.

use std::time::Duration;

use super::{MyCtx, RelayOnMysql, Scratch, SERVER};
use crate::cpu::CpuMeter;
use crate::latency::Probe;
use crate::load::{self, Paced, Produced};
use crate::{Drain, Report};

/// Default length of the load.
const DEFAULT_DURATION: Duration = Duration::from_secs(20);
/// Time the relay gets to take its partitions before the load starts.
pub(super) const SETTLE: Duration = Duration::from_secs(3);

/// Runs steady mode on MySQL.
pub async fn run(ctx: &MyCtx) -> anyhow::Result<Report> {
    let o = &ctx.options;
    let keys = match o.keys.as_slice() {
        [k] => *k,
        _ => anyhow::bail!("--keys takes one value in steady mode"),
    };
    let spec = Paced {
        rate: o.rate,
        producers: o.producers,
        duration: o.duration.unwrap_or(DEFAULT_DURATION),
        keys,
        pad: load::pad(o.payload_bytes),
    };
    println!(
        "outbox bench on MySQL/MariaDB: steady load of {} events/s for {:?}, one row per \
         transaction over {} connections, relay polling (at most {:?} between empty polls)",
        spec.rate,
        spec.duration,
        spec.producers,
        o.poll_interval
            .unwrap_or(outbox_relay::RelayConfig::default().poll_interval),
    );
    let scratch = Scratch::new(&ctx.pool, &ctx.js, o, "steady").await?;
    let result = measure(ctx, &scratch, &spec).await;
    scratch.drop().await;
    let (produced, drain) = result?;
    let cpu = drain.cpu.map_or(String::new(), |c| {
        format!(
            "; CPU per message: relay {:.1} µs, MariaDB {:.1} µs, broker {:.1} µs",
            c.relay_us, c.postgres_us, c.broker_us
        )
    });
    println!(
        "  committed {} events ({:.0} events/s); commit→ack {}{cpu}",
        produced.committed,
        produced.events_per_second,
        drain.latency.line()
    );
    Ok(Report::line(
        serde_json::json!({ "mode": "steady", "database": "mysql", "relay": drain }),
    ))
}

async fn measure(
    ctx: &MyCtx,
    scratch: &Scratch,
    spec: &Paced,
) -> anyhow::Result<(Produced, Drain)> {
    scratch.migrate(&ctx.options).await?;
    let probe = Probe::start(&scratch.js, &scratch.stream).await?;
    let relay = RelayOnMysql::start(&ctx.options, scratch).await?;
    tokio::time::sleep(SETTLE).await;
    let meter = CpuMeter::start_with(SERVER);
    let target = super::MysqlTarget::new(&scratch.pool, &scratch.schema);
    let produced = load::paced_into(&target, spec, &probe.latency()).await;
    let missing = probe.drain(Duration::from_secs(120)).await;
    let cpu = produced
        .as_ref()
        .ok()
        .and_then(|p| meter.per_message(p.committed));
    relay.stop().await;
    let produced = produced?;
    let latency = probe.finish().await;
    if missing > 0 {
        anyhow::bail!(
            "gave up after 120 s: {missing} of {} committed events never reached the stream",
            produced.committed
        );
    }
    Ok((
        produced,
        Drain {
            events: produced.committed,
            seconds: produced.seconds,
            events_per_second: produced.events_per_second,
            steady_events_per_second: None,
            latency,
            cpu,
        },
    ))
}
