//! `outbox inbox` from SQS (moto's server, `scripts/services.sh` starts it), in what is
//! particular to SQS: a queue kept longer than the inbox remembers gets a start-up warning.
//! Every message once across `kill -9` (in group order on a FIFO queue, in any order on a
//! standard one), what a dead consumer received, and bad source URLs are the source
//! conformance suite's (`inbox_sources.rs`, modules `sqs_fifo` and `sqs_standard`).

#![allow(clippy::unwrap_used)]

use crate::inboxkit;
use std::process::Stdio;
use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use inboxkit::{outbox, SqsChannel};
use outbox_testkit::inbox_backends::PgInbox;
use outbox_testkit::inbox_suite::InboxBackend;
use outbox_testkit::process::{sigterm, wait_exit};
use outbox_testkit::source_suite::{daemon_command, Channel};

/// A queue that keeps messages 14 days, longer than the inbox's 3-day retention remembers
/// them, gets a start-up warning naming the queue's retention.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_kept_longer_than_the_inbox_retention_is_warned_about() {
    outbox_testkit::brokers::moto_credentials();
    let b = PgInbox::start().await;
    let ch = SqsChannel::new("ibx", true).await;
    ch.client
        .set_queue_attributes()
        .queue_url(&ch.queue_url)
        .attributes(QueueAttributeName::MessageRetentionPeriod, "1209600")
        .send()
        .await
        .unwrap();
    let mut d = daemon_command(outbox, &b, &ch.source_url(), 20)
        .args(["--retention", "3d"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    sigterm(&d);
    let status = tokio::task::block_in_place(|| wait_exit(&mut d, Duration::from_secs(60)));
    assert!(status.success(), "{status}");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut d.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        err.contains("keeps messages for 14d") || err.contains("keeps messages for 14 d"),
        "{err}"
    );
    Box::new(ch).cleanup().await;
    b.teardown().await;
}
