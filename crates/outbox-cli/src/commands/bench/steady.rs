//! Steady mode: producers commit one row per transaction at `--rate` through the writer API
//! while the relay drains to NATS; commit→ack is measured at the broker for every message.

use std::process::ExitCode;
use std::time::Duration;

use super::latency::Probe;
use super::load::{paced, Paced, Produced};
use super::relay::RelayUnderTest;
use super::scratch::Scratch;
use super::{Ctx, Drain};

/// Default length of the load.
const DEFAULT_DURATION: Duration = Duration::from_secs(20);

/// Runs steady mode.
pub async fn run(ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let spec = Paced {
        rate: ctx.args.rate,
        producers: ctx.args.producers,
        duration: ctx.duration(DEFAULT_DURATION),
        keys: ctx.single_keys()?,
        pad: ctx.pad(),
    };
    println!(
        "outbox bench: steady load of {} events/s for {:?}, one row per transaction over {} connections, {}",
        spec.rate, spec.duration, spec.producers, ctx.wake_up()
    );
    let scratch = Scratch::with_outbox(&ctx.pool, &ctx.js, &ctx.args.storage, "steady").await?;
    let result = measure(ctx, &scratch, &spec).await;
    scratch.drop().await;
    let (produced, drain) = result?;
    println!(
        "  committed {} events ({:.0} events/s); commit→ack {}",
        produced.committed,
        produced.events_per_second,
        drain.latency.line()
    );
    if ctx.json() {
        println!(
            "{}",
            serde_json::json!({ "mode": "steady", "listen": ctx.args.listen, "relay": drain })
        );
    }
    Ok(ExitCode::SUCCESS)
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
        },
    ))
}
