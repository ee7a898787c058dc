//! What is particular to the SNS sink, against a real SNS API (moto's server on this machine):
//! a FIFO topic reached by its ARN, the key as the message group and the id as the dedupe id
//! end to end. Read back through an SQS queue subscribed with raw delivery (the sink's reader).
//! What every sink must do is the conformance suite's (`outbox-sinks/tests/conformance.rs`,
//! modules `sns` and `sns_standard`).

#![allow(clippy::unwrap_used)]

use crate::aws;
use crate::common;
use std::sync::Arc;
use std::time::Duration;

use aws::{moto_endpoint, run};
use common::World;
use outbox_core::Store;
use outbox_sinks::read::{scratch, ScratchOptions};
use outbox_sinks::sns::{create_topic, SnsConfig, SnsSink};
use outbox_testkit::relay::{
    assert_key_order, interleaved, keys, read_distinct, triples, RunningRelay,
};

/// Rows routed to a FIFO topic by its ARN arrive once each, each key in order (the key comes
/// back as the FIFO queue's `MessageGroupId`, which SNS passed on); the same ids published
/// again (a relay that crashed after SNS accepted them) are dropped by the
/// `MessageDeduplicationId` the sink sets. moto does not dedupe at the topic itself: it passes
/// the id on to the FIFO queue, which drops the copies, so this proves the id travels as the
/// dedupe id end to end.
#[test]
fn fifo_topic_by_arn_keeps_each_keys_order_with_the_key_as_group_and_the_id_as_dedupe_id() {
    run(async {
        let w = World::with_stream(false).await;
        let mut o = ScratchOptions::new("fifo");
        o.fifo = true;
        let mut s = scratch(&aws::url("sns", &moto_endpoint()), &o)
            .await
            .unwrap();
        let sink = Arc::new(
            SnsSink::connect(SnsConfig::sns_from_url(&s.sink_url).unwrap())
                .await
                .unwrap(),
        );
        // CreateTopic of an existing name (same attributes) answers its ARN.
        let arn = create_topic(sink.client(), &s.destination, true)
            .await
            .unwrap();
        let ks = keys("acct-", 8);
        let msgs = interleaved(&ks, 0..25);
        w.store().insert(&msgs).await.unwrap();
        let mut cfg = w.relay_config_to(&arn);
        // The sink's 5-second ack timeout fits in a third of the lease.
        cfg.lease = Duration::from_secs(15);
        let relay = RunningRelay::start(w.dyn_store(), sink.clone(), cfg);
        w.wait_drained(Duration::from_secs(60)).await;
        relay.stop().await;

        let got = read_distinct(s.reader.as_mut(), msgs.len(), Duration::from_secs(60)).await;
        assert_eq!(got.len(), msgs.len(), "every message once");
        let per_key = assert_key_order(triples(&got));
        assert_eq!(per_key.len(), ks.len());
        assert!(per_key.values().all(|&n| n == 25), "{per_key:?}");

        aws::assert_republished_ids_are_dropped(sink.as_ref(), &s.destination, s.reader.as_mut())
            .await;
        s.reader.cleanup().await;
        w.drop_all().await;
    });
}
