//! Steady mode, on PostgreSQL or MySQL/MariaDB: producers commit one row per transaction at
//! `--rate` through the writer API while the relay drains to NATS; commit→ack is measured at
//! the broker for every message. On MySQL/MariaDB (polling: it has no notifications) the CPU
//! each message cost the relay, the database server and the broker is measured too.

use std::time::Duration;

use crate::bed::Bed;
use crate::latency::Probe;
use crate::load::{self, Paced, Produced};
use crate::{Drain, Report};

/// Default length of the load.
const DEFAULT_DURATION: Duration = Duration::from_secs(20);

/// Runs steady mode on the database of `bed`.
pub async fn run(bed: Bed<'_>) -> anyhow::Result<Report> {
    let o = bed.options();
    let spec = Paced {
        rate: o.rate,
        producers: o.producers,
        duration: o.duration.unwrap_or(DEFAULT_DURATION),
        keys: crate::single_keys(o)?,
        pad: load::pad(o.payload_bytes),
    };
    match bed {
        Bed::Postgres(ctx) => println!(
            "outbox bench: steady load of {} events/s for {:?}, one row per transaction over {} connections, {}",
            spec.rate, spec.duration, spec.producers, ctx.wake_up()
        ),
        Bed::Mysql(_) => println!(
            "outbox bench on MySQL/MariaDB: steady load of {} events/s for {:?}, one row per \
             transaction over {} connections, relay polling (at most {:?} between empty polls)",
            spec.rate,
            spec.duration,
            spec.producers,
            o.poll_interval
                .unwrap_or(outbox_relay::RelayConfig::default().poll_interval),
        ),
    }
    let scratch = bed.scratch("steady").await?;
    let result = measure(bed, &scratch, &spec).await;
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
    Ok(Report::line(match bed {
        Bed::Postgres(_) => {
            serde_json::json!({ "mode": "steady", "listen": o.listen, "relay": drain })
        }
        Bed::Mysql(_) => {
            serde_json::json!({ "mode": "steady", "database": "mysql", "relay": drain })
        }
    }))
}

async fn measure(
    bed: Bed<'_>,
    scratch: &crate::bed::BedScratch,
    spec: &Paced,
) -> anyhow::Result<(Produced, Drain)> {
    let probe = Probe::start(scratch.js(), scratch.stream()).await?;
    let relay = bed.start_relay(scratch).await?;
    relay.settle().await;
    let meter = bed.cpu_meter();
    let produced = load::paced_into(&scratch.target(), spec, &probe.latency()).await;
    let missing = probe.drain(Duration::from_secs(120)).await;
    let cpu = match (&produced, &meter) {
        (Ok(p), Some(meter)) => meter.per_message(p.committed),
        _ => None,
    };
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
