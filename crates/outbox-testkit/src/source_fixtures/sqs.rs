//! SQS on moto: a FIFO or standard queue per channel.

use async_trait::async_trait;

use super::settle;
use crate::source_suite::{Channel, DaemonScale, Mistake, Order, Scale, SourceFixture, SECRET};
use crate::unique_name;

/// SQS on moto's server (`OUTBOX_TEST_MOTO_URL`): a FIFO or a standard queue per channel,
/// read with a 3-second visibility timeout so what a dead consumer received comes back soon.
///
/// moto answers a call in tens to hundreds of milliseconds on a busy machine, so the workloads
/// are small. One of its FIFO quirks shapes them: when several messages of one group come back
/// at once after their visibility timeout, moto hands out the group's last one first (SQS
/// returns them in order). A receive takes at most one message per group here, so the dead
/// consumer takes no more messages than there are keys, each the only one of its group.
pub struct Sqs {
    fifo: bool,
}

impl Sqs {
    /// FIFO queues: each key a message group, in order.
    pub fn fifo() -> Self {
        crate::brokers::moto_credentials();
        Self { fifo: true }
    }

    /// Standard queues: no order.
    pub fn standard() -> Self {
        crate::brokers::moto_credentials();
        Self { fifo: false }
    }
}

fn moto() -> String {
    crate::brokers::moto_endpoint()
}

/// A queue of its own.
pub struct SqsChannel {
    /// A client of moto's SQS.
    pub client: aws_sdk_sqs::Client,
    /// The queue's name.
    pub name: String,
    /// The queue's URL.
    pub queue_url: String,
}

impl SqsChannel {
    /// A queue on moto, FIFO when `fifo`.
    pub async fn new(tag: &str, fifo: bool) -> Self {
        let url = format!("sqs://?region=us-east-1&endpoint={}", moto());
        let client = outbox_sinks::sqs::reader_client(&url).await.unwrap();
        let mut name = unique_name(tag);
        if fifo {
            name.push_str(".fifo");
        }
        let queue_url = outbox_sinks::sqs::create_queue(&client, &name, fifo)
            .await
            .expect("moto must be running: scripts/services.sh starts it");
        Self {
            client,
            name,
            queue_url,
        }
    }

    /// (visible, in flight) messages, as SQS approximates them.
    pub async fn depth(&self) -> (u64, u64) {
        use aws_sdk_sqs::types::QueueAttributeName as A;
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.queue_url)
            .attribute_names(A::ApproximateNumberOfMessages)
            .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .unwrap();
        let a = out.attributes.unwrap_or_default();
        let get = |n: A| a.get(&n).and_then(|v| v.parse().ok()).unwrap_or(0);
        (
            get(A::ApproximateNumberOfMessages),
            get(A::ApproximateNumberOfMessagesNotVisible),
        )
    }
}

#[async_trait]
impl Channel for SqsChannel {
    fn source_url(&self) -> String {
        format!(
            "sqs://?queue={}&region=us-east-1&endpoint={}&visibility_timeout=3s",
            self.name,
            moto()
        )
    }
    /// moto answers a FIFO batch slowly when the machine is busy: a generous ack timeout.
    fn sink_url(&self) -> String {
        format!(
            "sqs://?region=us-east-1&endpoint={}&ack_timeout=60s",
            moto()
        )
    }
    fn destination(&self) -> String {
        self.name.clone()
    }
    async fn assert_drained(&mut self, _published: usize) {
        let me = &*self;
        settle("the queue", || async move {
            let depth = me.depth().await;
            (depth != (0, 0)).then(|| format!("(visible, in flight) = {depth:?}"))
        })
        .await;
    }
    /// The killed daemon's messages come back after the 3 s visibility timeout: the queue is
    /// empty once the running daemon took and deleted them.
    async fn await_redelivery(&mut self) {
        self.assert_drained(0).await;
    }
    async fn cleanup(self: Box<Self>) {
        let _ = self
            .client
            .delete_queue()
            .queue_url(&self.queue_url)
            .send()
            .await;
    }
}

#[async_trait]
impl SourceFixture for Sqs {
    async fn channel(&self, tag: &str) -> Box<dyn Channel> {
        Box::new(SqsChannel::new(tag, self.fifo).await)
    }
    fn order(&self) -> Order {
        if self.fifo {
            Order::PerKey
        } else {
            Order::None
        }
    }
    fn scale(&self) -> Scale {
        Scale {
            keys: 5,
            per_key: 8,
            dead_takes: 2,
            batch: 10,
        }
    }
    fn daemon_scale(&self) -> DaemonScale {
        DaemonScale {
            keys: 10,
            per_key: 12,
            kill_after: 40,
            more_per_key: 3,
            batch: 10,
        }
    }
    fn mistakes(&self) -> Vec<Mistake> {
        let endpoint = moto();
        vec![
            Mistake::new(
                format!("sqs://?region=us-east-1&endpoint={endpoint}"),
                "name the queue",
            ),
            Mistake::new(
                format!(
                    "sqs://?queue=q&region=us-east-1&endpoint=http://AKIA:{SECRET}@127.0.0.1:4566"
                ),
                "credentials",
            ),
            Mistake::new(
                format!("sqs://?queue=q&bogus={SECRET}&region=us-east-1"),
                "bogus",
            ),
            Mistake::new(
                format!("sqs://?queue=nope_nope&region=us-east-1&endpoint={endpoint}"),
                "no queue named `nope_nope` in us-east-1",
            ),
        ]
    }
}
