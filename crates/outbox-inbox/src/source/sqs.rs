//! [`SqsSource`]: an Amazon SQS queue (standard or FIFO), read with `ReceiveMessage` and
//! emptied with `DeleteMessageBatch` only after the ingest committed.
//!
//! Messages written by the SQS sink of `outbox relay` carry the relay's headers as message
//! attributes (`outbox-message-id`, `outbox-event-type`, `outbox-aggregate-id`, the row's own
//! headers, packed ones unpacked); on a FIFO queue the key is also the `MessageGroupId`.
//!
//! **Order.** A *standard* queue orders nothing: SQS may deliver any message before an older
//! one, and a message a dead daemon received comes back whenever its visibility timeout runs
//! out. Nothing a consumer does restores an order the queue never kept, so on a standard queue
//! the inbox's per-key order is only the order SQS happened to deliver in. A *FIFO* queue keeps
//! the order within each message group (the sink's key): while any message of a group is in
//! flight (received, neither deleted nor back), SQS delivers no other message of that group, to
//! anyone. So what a dead predecessor received and never deleted holds its groups back until
//! the visibility timeout runs out, and then comes back first in its group: [`Source::recover`]
//! has nothing to reorder, and the catch-up takes at most the queue's visibility timeout (the
//! other groups flow meanwhile). Between groups a FIFO queue promises no order either.

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName, QueueAttributeName,
};
use outbox_core::options::{Bounds, QueryOptions, Role};
use outbox_core::{Error, ErrorKind, Result};
use outbox_sinks::aws::AwsConfig;
use outbox_sinks::sqs::{call_error, message_headers, queue_url, QueueRef};
use tracing::warn;

use super::{AckInner, AckToken, Delivery, Source, SourceRetention};
use crate::message::{position_id, InboxMessage};

/// Default long poll of the first `ReceiveMessage` of a fetch: long enough that SQS asks all
/// of its servers (a short poll samples a few and may answer empty while messages wait), short
/// enough that the daemon stops promptly.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(1);

/// Longest long poll SQS takes.
const MAX_WAIT: Duration = Duration::from_secs(20);

/// Messages one `ReceiveMessage` or `DeleteMessageBatch` takes at most (SQS's limit).
const PER_CALL: usize = 10;

/// Longest visibility timeout SQS takes (12 hours).
const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);

/// Added to a call's own wait for the bound on its answer: a request the service never
/// answers becomes an error, not a hang (the SDK has its own bound as well).
const CALL_MARGIN: Duration = Duration::from_secs(10);

/// Where and how to consume.
#[derive(Debug, Clone)]
pub struct SqsSourceConfig {
    /// Region and endpoint (credentials come from the standard AWS chain, never the URL).
    pub aws: AwsConfig,
    /// The queue, by name (resolved with `GetQueueUrl`) or by URL.
    pub queue: QueueRef,
    /// Visibility timeout asked for on each receive (`?visibility_timeout=`); the queue's own
    /// when unset. It is how long a message a dead daemon received stays hidden, and how long
    /// a batch may take from receive to delete before SQS delivers it again.
    pub visibility_timeout: Option<Duration>,
    /// Long poll of the first receive of a fetch (`?wait=`, whole seconds, at most 20 s).
    pub wait: Duration,
    /// The `source` column: `sqs:<queue name>` unless given.
    pub name: String,
}

impl SqsSourceConfig {
    /// Parses `sqs://?queue=NAME_OR_URL[&region=R][&endpoint=URL][&visibility_timeout=60s]
    /// [&wait=1s][&name=N]`; region and endpoint as for the SQS sink.
    pub fn from_url(url: &str) -> Result<Self> {
        let known: Vec<&str> = ["queue", "visibility_timeout", "wait", "name"]
            .into_iter()
            .chain(["region", "endpoint"])
            .collect();
        let (base, o) = QueryOptions::from_url(Role::Source, url, &known)?;
        if base != "sqs://" {
            return Err(Error::config(format!(
                "source `{}`: write sqs://?queue=NAME_OR_URL&region=…: the queue is an option, \
                 and credentials come from the standard AWS chain (never the URL)",
                outbox_core::redact::url(url)
            )));
        }
        let queue = o.str("queue").map(str::to_string);
        let name = o.non_empty("name")?;
        // SQS takes both in whole seconds.
        let visibility_timeout = o.whole_seconds(
            "visibility_timeout",
            Bounds::new(Duration::ZERO, MAX_VISIBILITY),
        )?;
        let wait = o
            .whole_seconds("wait", Bounds::new(Duration::ZERO, MAX_WAIT))?
            .unwrap_or(DEFAULT_WAIT);
        let aws = AwsConfig::from_options("sqs", &o)?;
        let queue = queue.filter(|q| !q.is_empty()).ok_or_else(|| {
            Error::config(format!(
                "source `{}`: name the queue, e.g. sqs://?queue=orders.fifo&region=us-east-1",
                outbox_core::redact::url(url)
            ))
        })?;
        let queue = QueueRef::parse(&queue)
            .map_err(|e| Error::config(format!("source option queue: {}", e.message)))?;
        Ok(Self {
            name: name.map_or_else(|| format!("sqs:{}", queue.name()), str::to_string),
            aws,
            queue,
            visibility_timeout,
            wait,
        })
    }
}

/// An SQS queue as an inbox source.
pub struct SqsSource {
    cfg: SqsSourceConfig,
    client: aws_sdk_sqs::Client,
    queue_url: String,
    region: String,
}

/// Bounds `call` by `limit`: no answer in time is a connection error.
async fn bounded<T>(
    what: &str,
    limit: Duration,
    call: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, call).await.map_err(|_| {
        Error::new(
            ErrorKind::Connection,
            format!("sqs: {what}: no answer within {limit:?}"),
        )
    })?
}

impl SqsSource {
    /// Configures the SDK (the standard credentials chain) and resolves the queue's URL: a
    /// queue that does not exist is a config error naming it.
    pub async fn connect(cfg: SqsSourceConfig) -> Result<Self> {
        let sdk = cfg.aws.reader_sdk_config().await?;
        let region = sdk.region().map(|r| r.to_string()).unwrap_or_default();
        let client = aws_sdk_sqs::Client::new(&sdk);
        let queue_url = bounded(
            "GetQueueUrl",
            CALL_MARGIN * 3,
            queue_url(&client, &cfg.queue, &region),
        )
        .await?;
        Ok(Self {
            cfg,
            client,
            queue_url,
            region,
        })
    }

    fn fifo(&self) -> bool {
        self.cfg.queue.is_fifo()
    }

    /// The queue attributes `names`, as name → value.
    async fn attributes(
        &self,
        names: &[QueueAttributeName],
    ) -> Result<std::collections::HashMap<QueueAttributeName, String>> {
        let out = bounded("GetQueueAttributes", CALL_MARGIN, async {
            self.client
                .get_queue_attributes()
                .queue_url(&self.queue_url)
                .set_attribute_names(Some(names.to_vec()))
                .send()
                .await
                .map_err(|e| call_error("GetQueueAttributes", &e))
        })
        .await?;
        Ok(out.attributes.unwrap_or_default())
    }

    /// One `ReceiveMessage` of up to `n` messages, waiting up to `wait`.
    async fn receive(&self, n: usize, wait: Duration) -> Result<Vec<Message>> {
        let mut req = self
            .client
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(n.clamp(1, PER_CALL) as i32)
            .wait_time_seconds(wait.as_secs() as i32)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .message_system_attribute_names(MessageSystemAttributeName::SequenceNumber);
        if let Some(v) = self.cfg.visibility_timeout {
            req = req.visibility_timeout(v.as_secs() as i32);
        }
        let out = bounded("ReceiveMessage", wait + CALL_MARGIN, async {
            req.send()
                .await
                .map_err(|e| call_error("ReceiveMessage", &e))
        })
        .await?;
        Ok(out.messages.unwrap_or_default())
    }

    fn delivery(&self, m: Message) -> Option<Delivery> {
        let receipt = m.receipt_handle()?.to_string();
        let message_id = m.message_id().unwrap_or_default().to_string();
        let system = m.attributes();
        let group = system
            .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
            .cloned();
        // A FIFO queue numbers its messages; a standard queue has only the message id.
        let position = system
            .and_then(|a| a.get(&MessageSystemAttributeName::SequenceNumber))
            .cloned()
            .unwrap_or_else(|| message_id.clone());
        let queue = self.cfg.queue.name();
        let mut message = InboxMessage::from_broker(
            &self.cfg.name,
            m.body().unwrap_or_default().as_bytes(),
            message_headers(&m),
            position_id(&format!("sqs:{queue}"), &message_id),
            queue,
            group.as_deref(),
        );
        message.source_position = Some(position);
        Some(Delivery {
            message,
            ack: AckToken(AckInner::Sqs(receipt)),
        })
    }

    /// One `DeleteMessageBatch` of up to ten receipt handles; the number of entries that
    /// failed, with the first failure's code.
    async fn delete(&self, receipts: &[String]) -> Result<(usize, Option<String>)> {
        let entries: Vec<DeleteMessageBatchRequestEntry> = receipts
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(r)
                    .build()
                    .ok()
            })
            .collect();
        let out = bounded("DeleteMessageBatch", CALL_MARGIN, async {
            self.client
                .delete_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| call_error("DeleteMessageBatch", &e))
        })
        .await?;
        let failed = out.failed();
        let first = failed.first().map(|f| match f.message() {
            Some(m) => format!("{}: {m}", f.code()),
            None => f.code().to_string(),
        });
        Ok((failed.len(), first))
    }
}

#[async_trait]
impl Source for SqsSource {
    fn name(&self) -> &str {
        &self.cfg.name
    }

    fn describe(&self) -> String {
        format!(
            "SQS {} queue {} ({}{})",
            if self.fifo() { "FIFO" } else { "standard" },
            self.cfg.queue.name(),
            self.region,
            self.cfg
                .aws
                .endpoint
                .as_deref()
                .map(|e| format!(", endpoint {}", outbox_core::redact::url(e)))
                .unwrap_or_default()
        )
    }

    /// Nothing to reorder (see the module documentation): reports the messages in flight,
    /// which come back once their visibility timeout runs out.
    async fn recover(&mut self) -> Result<()> {
        let attrs = self
            .attributes(&[
                QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
                QueueAttributeName::VisibilityTimeout,
            ])
            .await?;
        let in_flight: u64 = attrs
            .get(&QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if in_flight > 0 {
            let visibility = self
                .cfg
                .visibility_timeout
                .map(|d| format!("{}s", d.as_secs()))
                .or_else(|| {
                    attrs
                        .get(&QueueAttributeName::VisibilityTimeout)
                        .map(|v| format!("{v}s"))
                })
                .unwrap_or_default();
            if self.fifo() {
                warn!(source = %self.cfg.name, in_flight, visibility_timeout = %visibility,
                      "messages received earlier (by a dead daemon?) are in flight: their message \
                       groups wait until they come back, at most one visibility timeout, and are \
                       then ingested in group order");
            } else {
                warn!(source = %self.cfg.name, in_flight, visibility_timeout = %visibility,
                      "messages received earlier (by a dead daemon?) are in flight: they come \
                       back after their visibility timeout, behind newer ones (a standard queue \
                       keeps no order)");
            }
        }
        Ok(())
    }

    async fn fetch(&mut self, max: usize) -> Result<Vec<Delivery>> {
        let max = max.max(1);
        let mut out = Vec::with_capacity(max.min(1000));
        // The first call waits for a message; the next ones take what is there, ten a call,
        // until the batch is full or a call comes back short.
        let mut wait = self.cfg.wait;
        while out.len() < max {
            let want = (max - out.len()).min(PER_CALL);
            let got = match self.receive(want, wait).await {
                Ok(got) => got,
                // What was received is in flight: ingest it rather than leave it hidden.
                Err(e) if !out.is_empty() => {
                    warn!(source = %self.cfg.name, error = %e, received = out.len(),
                          "a receive failed part-way through a batch; ingesting what came");
                    break;
                }
                Err(e) => return Err(e),
            };
            wait = Duration::ZERO;
            let short = got.len() < want;
            out.extend(got.into_iter().filter_map(|m| self.delivery(m)));
            if short {
                break;
            }
        }
        Ok(out)
    }

    async fn ack(&mut self, acks: Vec<AckToken>) -> Result<()> {
        let receipts: Vec<String> = acks
            .into_iter()
            .filter_map(|a| match a.0 {
                AckInner::Sqs(r) => Some(r),
                #[allow(unreachable_patterns)]
                _ => None,
            })
            .collect();
        let results =
            futures::future::join_all(receipts.chunks(PER_CALL).map(|chunk| self.delete(chunk)))
                .await;
        let (mut failed, mut first) = (0usize, None);
        for (r, chunk) in results.into_iter().zip(receipts.chunks(PER_CALL)) {
            match r {
                Ok((n, code)) => {
                    failed += n;
                    first = first.or(code);
                }
                Err(e) => {
                    failed += chunk.len();
                    first = first.or(Some(e.to_string()));
                }
            }
        }
        if failed > 0 {
            // An undeleted message becomes visible again after its visibility timeout and is
            // absorbed by the inbox; on a FIFO queue its group waits for it meanwhile.
            return Err(Error::new(
                ErrorKind::Connection,
                format!(
                    "sqs: {failed} of {} messages were not deleted ({}); SQS delivers them \
                     again after the visibility timeout",
                    receipts.len(),
                    first.unwrap_or_default()
                ),
            ));
        }
        Ok(())
    }

    async fn retention(&mut self) -> Result<SourceRetention> {
        let attrs = self
            .attributes(&[QueueAttributeName::MessageRetentionPeriod])
            .await?;
        let secs = attrs
            .get(&QueueAttributeName::MessageRetentionPeriod)
            .and_then(|v| v.parse::<u64>().ok());
        Ok(match secs {
            Some(s) => SourceRetention::For(Duration::from_secs(s)),
            None => SourceRetention::Unknown,
        })
    }
}

/// This source's entry in [`super::SOURCES`].
pub(super) const KIND: super::SourceKind = super::SourceKind {
    schemes: &["sqs"],
    listed: "sqs://",
    open: |url, _| {
        super::boxed(async move { SqsSource::connect(SqsSourceConfig::from_url(url)?).await })
    },
    check: |url| SqsSourceConfig::from_url(url).map(|_| ()),
};

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn url_options_parse() {
        let c = SqsSourceConfig::from_url(
            "sqs://?queue=orders.fifo&region=us-east-1&endpoint=http://127.0.0.1:4566\
             &visibility_timeout=45s&wait=2s",
        )
        .unwrap();
        assert_eq!(c.queue, QueueRef::Name("orders.fifo".into()));
        assert!(c.queue.is_fifo());
        assert_eq!(c.aws.region.as_deref(), Some("us-east-1"));
        assert_eq!(c.aws.endpoint.as_deref(), Some("http://127.0.0.1:4566"));
        assert_eq!(c.visibility_timeout, Some(Duration::from_secs(45)));
        assert_eq!(c.wait, Duration::from_secs(2));
        assert_eq!(c.name, "sqs:orders.fifo");
        let u = SqsSourceConfig::from_url(
            "sqs://?queue=http%3A%2F%2F127.0.0.1%3A4566%2F000000000000%2Forders&name=n",
        )
        .unwrap();
        assert_eq!(
            u.queue,
            QueueRef::Url("http://127.0.0.1:4566/000000000000/orders".into())
        );
        assert_eq!(u.name, "n");
        assert_eq!(u.wait, DEFAULT_WAIT);
    }

    #[test]
    fn bad_urls_are_config_errors_that_name_the_problem_without_secrets() {
        for (url, says) in [
            ("sqs://?region=us-east-1", "name the queue"),
            ("sqs://?queue=a.b", "queue"),
            ("sqs://?queue=q&bogus=1", "bogus"),
            ("sqs://?queue=q&wait=30s", "wait"),
            (
                "sqs://?queue=q&visibility_timeout=500ms",
                "visibility_timeout",
            ),
            ("sqs://?queue=q&ack_timeout=5s", "ack_timeout"),
            ("sqs://AKIA:s3cret@host?queue=q", "credentials"),
            (
                "sqs://?queue=q&endpoint=http://AKIA:s3cret@127.0.0.1:4566",
                "credentials",
            ),
        ] {
            let e = SqsSourceConfig::from_url(url).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config, "{url}");
            assert!(e.to_string().contains(says), "{url}: {e}");
            assert!(!e.to_string().contains("s3cret"), "{url}: {e}");
        }
    }
}
