//! `outbox inbox` from SQS as users run it: the real binary consuming a queue of moto's server
//! (`scripts/services.sh` starts it) into PostgreSQL, killed with `kill -9` mid-stream and
//! restarted: nothing lost, nothing twice in the inbox or its queue, the queue emptied. On a
//! FIFO queue each key (message group) is recorded in publish order, also when a dead consumer
//! had received messages and never deleted them; a standard queue promises no order, and none
//! is asserted. Messages are published by the relay's own SQS sink.
//!
//! The source URLs ask for a 3-second visibility timeout, so what a killed daemon received
//! comes back quickly. moto answers a call in tens to hundreds of milliseconds on a busy
//! machine, so the workloads are a hundred-odd messages.
//!
//! One of moto's FIFO emulation quirks shapes the workloads: when *several* messages of one
//! group come back at once after their visibility timeout, moto hands out the group's last one
//! first (its receive loop frees the group only once it reaches the group's last in-flight
//! message). SQS itself returns them in order. So here every message in flight is the only one
//! of its group: ten keys, interleaved, and batches of ten (one `ReceiveMessage` per fetch,
//! which then takes one message of each group).

#![allow(clippy::unwrap_used)]

#[path = "common/aws.rs"]
mod aws;
mod common;
#[path = "common/inbox.rs"]
mod inboxkit;

use inboxkit::{calls, workload, Inbox};
use std::process::Stdio;
use std::time::{Duration, Instant};

use aws::{moto_endpoint, run};
use aws_sdk_sqs::types::QueueAttributeName;
use common::{sigterm, wait_exit};
use outbox_core::{Envelope, Sink};
use outbox_sinks::sqs::{create_queue, reader_client, SqsConfig, SqsSink};
use uuid::Uuid;

fn aws_url() -> String {
    format!("sqs://?region=us-east-1&endpoint={}", moto_endpoint())
}

/// A queue of its own, published to by the relay's SQS sink.
struct Queue {
    client: aws_sdk_sqs::Client,
    sink: SqsSink,
    name: String,
    url: String,
}

impl Queue {
    async fn new(fifo: bool) -> Self {
        let client = reader_client(&aws_url()).await.unwrap();
        let mut name = outbox_testkit::unique_name("ibx");
        if fifo {
            name.push_str(".fifo");
        }
        let url = create_queue(&client, &name, fifo).await.unwrap();
        // moto answers a FIFO batch slowly when the machine is busy: a generous ack timeout.
        let sink = SqsSink::connect(
            SqsConfig::sqs_from_url(&format!("{}&ack_timeout=60s", aws_url())).unwrap(),
        )
        .await
        .unwrap();
        Self {
            client,
            sink,
            name,
            url,
        }
    }

    /// The source URL: the queue by name, a 3-second visibility timeout.
    fn source(&self) -> String {
        format!(
            "sqs://?queue={}&region=us-east-1&endpoint={}&visibility_timeout=3s",
            self.name,
            moto_endpoint()
        )
    }

    /// Publishes through the SQS sink, in order, as the relay does: the relay's headers as
    /// attributes, and on a FIFO queue the key as the group and the id as the dedupe id.
    async fn publish(&self, msgs: &[(Uuid, String, i64)]) {
        for chunk in calls(msgs) {
            let batch: Vec<Envelope> = chunk
                .iter()
                .map(|(id, key, n)| Envelope {
                    id: *id,
                    destination: self.name.clone(),
                    key: key.clone(),
                    headers: vec![
                        ("outbox-message-id".into(), id.to_string()),
                        ("outbox-event-type".into(), "order.paid".into()),
                        ("outbox-aggregate-type".into(), "order".into()),
                        ("outbox-aggregate-id".into(), key.clone()),
                    ],
                    payload: bytes::Bytes::from(serde_json::json!({ "n": n }).to_string()),
                    created_at: chrono::Utc::now(),
                })
                .collect();
            for r in self.sink.publish(&batch).await {
                r.unwrap();
            }
        }
    }

    /// (visible, in flight) messages, as SQS approximates them.
    async fn depth(&self) -> (u64, u64) {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .unwrap();
        let a = out.attributes.unwrap_or_default();
        let get = |n: QueueAttributeName| a.get(&n).and_then(|v| v.parse().ok()).unwrap_or(0);
        (
            get(QueueAttributeName::ApproximateNumberOfMessages),
            get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        )
    }

    async fn drop_all(self) {
        let _ = self.client.delete_queue().queue_url(&self.url).send().await;
    }
}

/// Kills a daemon mid-stream, publishes more while none runs, restarts it: every message once,
/// and (FIFO) each key in publish order, the queue empty at the end.
async fn survives_sigkill(fifo: bool) {
    let inbox = Inbox::new().await;
    let queue = Queue::new(fifo).await;
    let msgs = workload(10, 12, 0);
    queue.publish(&msgs).await;
    let mut a = inbox.daemon(&queue.source(), 10);
    inbox.wait_count(40, Duration::from_secs(90)).await;
    a.kill().unwrap(); // SIGKILL: the batch in hand is neither committed nor deleted
    a.wait().unwrap();
    assert!(
        inbox.count().await < msgs.len() as i64,
        "the daemon finished before it was killed: nothing tested"
    );
    let more = workload(10, 3, 12);
    queue.publish(&more).await;
    let all: Vec<_> = msgs.iter().chain(&more).cloned().collect();
    let mut b = inbox.daemon(&queue.source(), 10);
    inbox
        .wait_count(all.len() as i64, Duration::from_secs(120))
        .await;
    // Long enough for a duplicate to show: a visibility timeout and a little more.
    tokio::time::sleep(Duration::from_secs(4)).await;
    if fifo {
        inbox.check(&all).await;
    } else {
        inbox.check_unordered(&all).await;
    }
    assert_eq!(queue.depth().await, (0, 0), "the queue is empty");
    sigterm(&b);
    assert!(wait_exit(&mut b, Duration::from_secs(15)).success());
    queue.drop_all().await;
    inbox.drop_all().await;
}

#[test]
fn inbox_killed_with_sigkill_mid_stream_from_an_sqs_fifo_queue_loses_nothing_and_keeps_key_order() {
    run(survives_sigkill(true));
}

/// A standard queue keeps no order: only "every message once" is asserted.
#[test]
fn inbox_killed_with_sigkill_mid_stream_from_an_sqs_standard_queue_loses_nothing_and_records_nothing_twice(
) {
    run(survives_sigkill(false));
}

/// A consumer received the first message of two groups and died without deleting them. The
/// other groups flow at once; those two wait until the visibility timeout (3 s) brings the
/// received messages back, and are then recorded in publish order, the newer ones after. (One
/// message per group: see the module comment on moto.)
#[test]
fn messages_a_dead_consumer_received_from_an_sqs_fifo_queue_are_recorded_before_newer_ones_of_their_group(
) {
    run(async {
        let inbox = Inbox::new().await;
        let queue = Queue::new(true).await;
        let first = workload(2, 1, 0);
        queue.publish(&first).await;
        let stolen = queue
            .client
            .receive_message()
            .queue_url(&queue.url)
            .max_number_of_messages(10)
            .visibility_timeout(3)
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default();
        let stolen_at = Instant::now();
        assert_eq!(stolen.len(), 2, "the dead consumer's batch");
        let rest = workload(5, 8, 1);
        queue.publish(&rest).await;
        let all: Vec<_> = first.iter().chain(&rest).cloned().collect();
        let mut d = inbox.daemon(&queue.source(), 10);
        inbox
            .wait_count(all.len() as i64, Duration::from_secs(90))
            .await;
        assert!(
            stolen_at.elapsed() >= Duration::from_secs(3),
            "the stolen groups came back before their visibility timeout ran out"
        );
        inbox.check(&all).await;
        assert_eq!(queue.depth().await, (0, 0));
        sigterm(&d);
        assert!(wait_exit(&mut d, Duration::from_secs(15)).success());
        queue.drop_all().await;
        inbox.drop_all().await;
    });
}

/// URL and setup mistakes end the daemon with an error that names the problem, never a
/// credential; a queue kept longer than the inbox remembers gets a start-up warning.
#[test]
fn sqs_source_mistakes_are_clear_errors_and_a_long_retention_is_warned_about() {
    run(async {
        let inbox = Inbox::new().await;
        let endpoint = moto_endpoint();
        for (source, says) in [
            (
                format!("sqs://?region=us-east-1&endpoint={endpoint}"),
                "name the queue".to_string(),
            ),
            (
                "sqs://?queue=q&region=us-east-1&endpoint=http://AKIA:s3cret@127.0.0.1:4566"
                    .to_string(),
                "credentials".to_string(),
            ),
            (
                "sqs://?queue=q&bogus=s3cret&region=us-east-1".to_string(),
                "bogus".to_string(),
            ),
            (
                format!("sqs://?queue=nope_nope&region=us-east-1&endpoint={endpoint}"),
                "no queue named `nope_nope` in us-east-1".to_string(),
            ),
        ] {
            let o = inbox
                .command(&source, 20)
                .stderr(Stdio::piped())
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(!o.status.success(), "{source}: {err}");
            assert!(err.contains(&says), "{source}: {err}");
            assert!(!err.contains("s3cret"), "{source}: {err}");
        }
        let queue = Queue::new(true).await;
        queue
            .client
            .set_queue_attributes()
            .queue_url(&queue.url)
            .attributes(QueueAttributeName::MessageRetentionPeriod, "1209600")
            .send()
            .await
            .unwrap();
        let mut d = inbox
            .command(&queue.source(), 20)
            .args(["--retention", "3d"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        sigterm(&d);
        assert!(wait_exit(&mut d, Duration::from_secs(15)).success());
        let mut err = String::new();
        std::io::Read::read_to_string(&mut d.stderr.take().unwrap(), &mut err).unwrap();
        assert!(
            err.contains("keeps messages for 14d") || err.contains("keeps messages for 14 d"),
            "{err}"
        );
        queue.drop_all().await;
        inbox.drop_all().await;
    });
}
