//! The Redis variant of the dedupe claim (`SET NX PX`) against the machine's Redis: first
//! claim wins, a repeat within the TTL is refused, the claim expires with its TTL (the weaker
//! guarantee, stated in `docs/consumers.md`), and `release` undoes a claim whose effect failed.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use outbox_inbox::redis_dedupe::RedisDedupe;
use uuid::Uuid;

#[tokio::test]
async fn a_redis_claim_wins_once_per_ttl_and_can_be_released() {
    let prefix = outbox_testkit::unique_name("dedupe");
    let url =
        std::env::var("OUTBOX_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let d = RedisDedupe::connect(&url, &prefix).await.unwrap();
    let id = Uuid::now_v7();
    let ttl = Duration::from_millis(400);
    assert!(d.claim("billing", id, ttl).await.unwrap());
    assert!(!d.claim("billing", id, ttl).await.unwrap());
    assert!(
        d.claim("shipping", id, ttl).await.unwrap(),
        "claims are per consumer"
    );
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    assert!(
        d.claim("billing", id, ttl).await.unwrap(),
        "Redis forgets after the TTL"
    );
    d.release("billing", id).await.unwrap();
    assert!(
        d.claim("billing", id, ttl).await.unwrap(),
        "a released claim can be taken again"
    );
    // Two racing consumers: exactly one wins.
    let other = Uuid::now_v7();
    let (a, b) = tokio::join!(
        d.claim("billing", other, ttl),
        d.claim("billing", other, ttl)
    );
    assert!(a.unwrap() ^ b.unwrap());
}
