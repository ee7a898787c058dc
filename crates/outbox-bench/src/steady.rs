//! Steady mode: producers commit one row per transaction at `--rate` through the writer API
//! while the relay drains to NATS; commit→ack is measured at the broker for every message.

use std::time::Duration;

use crate::latency::Probe;
use crate::load::{paced, Paced, Produced};
use crate::relay::RelayUnderTest;
use crate::scratch::Scratch;
use crate::{Ctx, Drain, Report};

/// Default length of the load.
const DEFAULT_DURATION: Duration = Duration::from_secs(20);

/// Runs steady mode.
pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let spec = Paced {
        rate: ctx.options.rate,
        producers: ctx.options.producers,
        duration: ctx.duration(DEFAULT_DURATION),
        keys: ctx.single_keys()?,
        pad: ctx.pad(),
    };
    println!(
        "outbox bench: steady load of {} events/s for {:?}, one row per transaction over {} connections, {}",
        spec.rate, spec.duration, spec.producers, ctx.wake_up()
    );
    let scratch = Scratch::with_outbox(&ctx.pool, &ctx.js, ctx.options.storage, "steady").await?;
    let result = measure(ctx, &scratch, &spec).await;
    scratch.drop().await;
    let (produced, drain) = result?;
    println!(
        "  committed {} events ({:.0} events/s); commit→ack {}",
        produced.committed,
        produced.events_per_second,
        drain.latency.line()
    );
    Ok(Report::line(
        serde_json::json!({ "mode": "steady", "listen": ctx.options.listen, "relay": drain }),
    ))
}

async fn measure(ctx: &Ctx, scratch: &Scratch, spec: &Paced) -> anyhow::Result<(Produced, Drain)> {
    let probe = Probe::start(&scratch.js, &scratch.stream).await?;
    let relay = RelayUnderTest::start(ctx, scratch).await?;
    relay.settle().await;
    let produced = paced(&scratch.pool, &scratch.schema, spec, &probe.latency()).await;
    let missing = probe.drain(Duration::from_secs(120)).await;
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
            cpu: None,
        },
    ))
}
