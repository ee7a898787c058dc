//! [`SqsReader`]: reads a scratch SQS queue with `ReceiveMessage` and deletes what it read.

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName, QueueAttributeName,
};
use bytes::Bytes;
use outbox_core::sink::{HEADER_AGGREGATE_ID, HEADER_MESSAGE_ID};
use outbox_core::{Error, ErrorKind};

use super::consumer::message_headers;
use super::SqsConfig;
use crate::read::{Delivered, Polled, Reader, Scratch, ScratchOptions};

/// Longest wait of one `ReceiveMessage` long poll (SQS's own maximum).
const MAX_LONG_POLL: Duration = Duration::from_secs(20);

/// How long a received message stays hidden from other receives: if the reader dies between
/// receiving and deleting it, it comes back (a duplicate the checker counts) after this.
const VISIBILITY_TIMEOUT_SECS: &str = "60";

/// Messages one poll returns at most, so a caller polling a busy queue gets control back.
const MAX_PER_POLL: usize = 2_000;

/// An SDK client for readers and tools beside the sink (scratch setup, tests): `url`'s region,
/// endpoint and credentials chain, with a call bound that fits a 20-second long poll.
pub async fn reader_client(url: &str) -> Result<aws_sdk_sqs::Client, Error> {
    let sdk = SqsConfig::sqs_from_url(url)?.reader_sdk_config().await?;
    Ok(aws_sdk_sqs::Client::new(&sdk))
}

/// Creates the queue `name` (FIFO when `fifo`: the name must then end with `.fifo`; no
/// content-based dedupe, so the message id is the only dedupe key) and returns its URL.
pub async fn create_queue(
    client: &aws_sdk_sqs::Client,
    name: &str,
    fifo: bool,
) -> Result<String, Error> {
    let mut req = client.create_queue().queue_name(name).attributes(
        QueueAttributeName::VisibilityTimeout,
        VISIBILITY_TIMEOUT_SECS,
    );
    if fifo {
        req = req
            .attributes(QueueAttributeName::FifoQueue, "true")
            .attributes(QueueAttributeName::ContentBasedDeduplication, "false");
    }
    let out = req.send().await.map_err(|e| {
        Error::with_source(
            ErrorKind::Connection,
            format!(
                "sqs: creating queue {name}: {}",
                aws_sdk_sqs::error::DisplayErrorContext(&e)
            ),
            e,
        )
    })?;
    out.queue_url()
        .map(str::to_string)
        .ok_or_else(|| Error::config(format!("sqs: CreateQueue {name} returned no URL")))
}

/// A consumer of one queue: receives up to ten messages a call with every attribute, and
/// deletes each batch once read, so every message is returned once unless a delete fails.
pub struct SqsReader {
    client: aws_sdk_sqs::Client,
    queue_url: String,
    destination: String,
    delete_queue: bool,
}

impl SqsReader {
    /// A reader of the queue at `queue_url`; deliveries report `destination` as where they
    /// arrived (the queue name, or the topic an SNS reader reads through this queue).
    /// `delete_queue`: whether [`Reader::cleanup`] deletes the queue.
    pub fn new(
        client: aws_sdk_sqs::Client,
        queue_url: String,
        destination: String,
        delete_queue: bool,
    ) -> Self {
        Self {
            client,
            queue_url,
            destination,
            delete_queue,
        }
    }

    /// The queue's URL.
    pub fn queue_url(&self) -> &str {
        &self.queue_url
    }

    /// One `ReceiveMessage` waiting up to `wait` (whole seconds; below one a short poll), and
    /// a `DeleteMessageBatch` of what came. `None` when the call failed.
    async fn receive(&self, wait: Duration) -> Option<Vec<Message>> {
        let secs = wait.min(MAX_LONG_POLL).as_secs() as i32;
        let out = self
            .client
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(10)
            .wait_time_seconds(secs)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .send()
            .await
            .ok()?;
        let messages = out.messages.unwrap_or_default();
        let entries: Vec<DeleteMessageBatchRequestEntry> = messages
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .set_receipt_handle(m.receipt_handle().map(str::to_string))
                    .build()
                    .ok()
            })
            .collect();
        if !entries.is_empty() {
            // A failed delete lets the message come back after the visibility timeout: a
            // duplicate the checker sees, never a loss.
            if let Err(error) = self
                .client
                .delete_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
            {
                tracing::warn!(queue = %self.queue_url, error = %aws_sdk_sqs::error::DisplayErrorContext(&error), "could not delete received messages");
            }
        }
        Some(messages)
    }

    /// A delivery from `m`: the id from `outbox-message-id`, the key from the FIFO group (or
    /// the `outbox-aggregate-id` attribute on a standard queue), the attributes with
    /// `outbox-headers` unpacked, sorted by name. `None` without an id.
    fn delivered(&self, m: &Message) -> Option<Delivered> {
        let headers = message_headers(m);
        let find = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        // CloudEvents binary mode leaves the `outbox-*` duplicates out: `ce-id` is the id.
        let id = find(HEADER_MESSAGE_ID)
            .or_else(|| find("ce-id"))?
            .parse()
            .ok()?;
        let group = m
            .attributes()
            .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
            .cloned();
        let key = group
            .or_else(|| find(HEADER_AGGREGATE_ID))
            .or_else(|| find("ce-subject"))
            .unwrap_or_default();
        Some(Delivered {
            id,
            destination: self.destination.clone(),
            key,
            headers,
            payload: Bytes::from(m.body().unwrap_or_default().to_string()),
        })
    }
}

#[async_trait]
impl Reader for SqsReader {
    async fn poll(&mut self, wait: Duration) -> Polled {
        let mut out = Polled::default();
        let until = tokio::time::Instant::now() + wait.max(Duration::from_millis(20));
        loop {
            let now = tokio::time::Instant::now();
            let got_some = !out.delivered.is_empty() || out.unreadable > 0;
            if now >= until || out.delivered.len() >= MAX_PER_POLL {
                break;
            }
            // Wait for the first message; after it, take what is there and return.
            let wait = if got_some {
                Duration::ZERO
            } else {
                until - now
            };
            let Some(messages) = self.receive(wait).await else {
                // The service is down: nothing consumed; wait a little rather than spin.
                tokio::time::sleep(
                    (until - tokio::time::Instant::now()).min(Duration::from_millis(200)),
                )
                .await;
                break;
            };
            if messages.is_empty() {
                if got_some {
                    break;
                }
                // A short poll (less than a second left) found nothing: look again soon.
                if wait < Duration::from_secs(1) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
            for m in &messages {
                match self.delivered(m) {
                    Some(d) => out.delivered.push(d),
                    None => out.unreadable += 1,
                }
            }
        }
        out
    }

    fn describe(&self) -> String {
        format!("SQS queue {}", self.queue_url)
    }

    async fn cleanup(&mut self) {
        if !self.delete_queue {
            return;
        }
        if let Err(error) = self
            .client
            .delete_queue()
            .queue_url(&self.queue_url)
            .send()
            .await
        {
            tracing::warn!(queue = %self.queue_url, error = %aws_sdk_sqs::error::DisplayErrorContext(&error), "could not delete a scratch queue");
        }
    }
}

/// A queue `outbox_<tag>_<suffix>` (`.fifo` and FIFO when `options.fifo`) and a reader of
/// it; the relay publishes to the queue by name.
pub(crate) async fn scratch(url: &str, options: &ScratchOptions) -> Result<Scratch, Error> {
    let client = reader_client(url).await?;
    let mut name = options.unique_name();
    if options.fifo {
        name.push_str(".fifo");
    }
    let queue_url = create_queue(&client, &name, options.fifo).await?;
    Ok(Scratch {
        sink_url: url.to_string(),
        destination: name.clone(),
        reader: Box::new(SqsReader::new(client, queue_url, name, true)),
    })
}
