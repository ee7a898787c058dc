//! Steady mode on MySQL/MariaDB: producers commit one row per transaction at `--rate` through the
//! MySQL writer while the relay (polling: MySQL has no notifications) drains to NATS; commit→ack
//! is measured at the broker for every message, and the CPU each message cost the relay, the
//! database server and the broker over the same stretch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_mysql::Schema;
use sqlx::MySqlPool;

use super::{MyCtx, RelayOnMysql, Scratch, SERVER};
use crate::cpu::CpuMeter;
use crate::latency::{Latency, Probe};
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
    outbox_mysql::migrate(&scratch.pool, &scratch.schema).await?;
    let probe = Probe::start(&scratch.js, &scratch.stream).await?;
    let relay = RelayOnMysql::start(&ctx.options, scratch).await?;
    tokio::time::sleep(SETTLE).await;
    let meter = CpuMeter::start_with(SERVER);
    let produced = paced(&scratch.pool, &scratch.schema, spec, &probe.latency()).await;
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

/// The paced load of [`load::paced`] through the MySQL writer: `producers` connections share
/// `rate` transactions per second, one message each. A producer that falls behind does not
/// catch up in bursts, so the achieved rate shows any shortfall.
pub(super) async fn paced(
    pool: &MySqlPool,
    schema: &Schema,
    spec: &Paced,
    latency: &Arc<Latency>,
) -> anyhow::Result<Produced> {
    let producers = spec.producers.max(1);
    let period = Duration::from_secs_f64(producers as f64 / f64::from(spec.rate.max(1)))
        .max(Duration::from_micros(10));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..producers {
        let (pool, schema, spec, latency) =
            (pool.clone(), schema.clone(), spec.clone(), latency.clone());
        tasks.push(tokio::spawn(async move {
            let start = tokio::time::Instant::now() + period.mul_f64(p as f64 / producers as f64);
            let mut tick = tokio::time::interval_at(start, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let (mut done, mut i) = (0u64, p);
            while started.elapsed() < spec.duration {
                tick.tick().await;
                let m = load::message(i, spec.keys, &spec.pad);
                let mut tx = pool.begin().await?;
                outbox_mysql::enqueue(&mut tx, &schema, &m).await?;
                let sent = latency.stamp();
                tx.commit().await?;
                latency.committed([m.id], sent);
                done += 1;
                i += producers;
            }
            anyhow::Ok(done)
        }));
    }
    let mut committed = 0u64;
    for t in tasks {
        committed += t.await??;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Produced {
        committed,
        seconds,
        events_per_second: committed as f64 / seconds,
    })
}
