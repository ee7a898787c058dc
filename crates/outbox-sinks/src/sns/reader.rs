//! [`SnsReader`]: reads a scratch SNS topic through an SQS queue subscribed to it with raw
//! message delivery, so the message attributes arrive as SQS message attributes.

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::types::QueueAttributeName;
use outbox_core::{Error, ErrorKind};

use super::SnsConfig;
use crate::read::{Polled, Reader, Scratch, ScratchOptions};
use crate::sqs::{create_queue, SqsReader};

fn setup_error<E>(what: String, e: E) -> Error
where
    E: std::error::Error + Send + Sync + 'static,
{
    let text = aws_sdk_sqs::error::DisplayErrorContext(&e).to_string();
    Error::with_source(ErrorKind::Connection, format!("sns: {what}: {text}"), e)
}

/// Creates the topic `name` (FIFO when `fifo`: the name must then end with `.fifo`; no
/// content-based dedupe, so the message id is the only dedupe key) and returns its ARN.
pub async fn create_topic(
    client: &aws_sdk_sns::Client,
    name: &str,
    fifo: bool,
) -> Result<String, Error> {
    let mut req = client.create_topic().name(name);
    if fifo {
        req = req
            .attributes("FifoTopic", "true")
            .attributes("ContentBasedDeduplication", "false");
    }
    let out = req
        .send()
        .await
        .map_err(|e| setup_error(format!("creating topic {name}"), e))?;
    out.topic_arn()
        .map(str::to_string)
        .ok_or_else(|| Error::config(format!("sns: CreateTopic {name} returned no ARN")))
}

/// Subscribes the queue at `queue_url` to `topic_arn` with raw message delivery (the body
/// arrives as published, the attributes as SQS message attributes), after giving the topic the
/// queue policy AWS needs to deliver to it. Returns the subscription's ARN.
pub async fn subscribe_queue(
    sns: &aws_sdk_sns::Client,
    sqs: &aws_sdk_sqs::Client,
    topic_arn: &str,
    queue_url: &str,
) -> Result<String, Error> {
    let attrs = sqs
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| setup_error(format!("reading the ARN of {queue_url}"), e))?;
    let queue_arn = attrs
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn))
        .cloned()
        .ok_or_else(|| Error::config(format!("sns: queue {queue_url} has no QueueArn")))?;
    let policy = serde_json::json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Principal": { "Service": "sns.amazonaws.com" },
            "Action": "sqs:SendMessage",
            "Resource": queue_arn,
            "Condition": { "ArnEquals": { "aws:SourceArn": topic_arn } }
        }]
    });
    sqs.set_queue_attributes()
        .queue_url(queue_url)
        .attributes(QueueAttributeName::Policy, policy.to_string())
        .send()
        .await
        .map_err(|e| setup_error(format!("setting the policy of {queue_url}"), e))?;
    let sub = sns
        .subscribe()
        .topic_arn(topic_arn)
        .protocol("sqs")
        .endpoint(&queue_arn)
        .attributes("RawMessageDelivery", "true")
        .return_subscription_arn(true)
        .send()
        .await
        .map_err(|e| setup_error(format!("subscribing {queue_arn} to {topic_arn}"), e))?;
    Ok(sub.subscription_arn().unwrap_or_default().to_string())
}

/// A consumer of one topic: an [`SqsReader`] of the queue subscribed to it, whose deliveries
/// name the topic as their destination. Cleanup removes the subscription, the topic and the
/// queue.
pub struct SnsReader {
    queue: SqsReader,
    sns: aws_sdk_sns::Client,
    topic_arn: String,
    subscription_arn: String,
}

impl SnsReader {
    /// A reader of `topic_arn` through `queue` (subscribed as `subscription_arn`).
    pub fn new(
        queue: SqsReader,
        sns: aws_sdk_sns::Client,
        topic_arn: String,
        subscription_arn: String,
    ) -> Self {
        Self {
            queue,
            sns,
            topic_arn,
            subscription_arn,
        }
    }
}

#[async_trait]
impl Reader for SnsReader {
    async fn poll(&mut self, wait: Duration) -> Polled {
        self.queue.poll(wait).await
    }

    fn describe(&self) -> String {
        format!(
            "SNS topic {} (read through SQS queue {})",
            self.topic_arn,
            self.queue.queue_url()
        )
    }

    async fn cleanup(&mut self) {
        if !self.subscription_arn.is_empty() {
            if let Err(error) = self
                .sns
                .unsubscribe()
                .subscription_arn(&self.subscription_arn)
                .send()
                .await
            {
                tracing::warn!(subscription = %self.subscription_arn, error = %aws_sdk_sns::error::DisplayErrorContext(&error), "could not remove a scratch subscription");
            }
        }
        if let Err(error) = self
            .sns
            .delete_topic()
            .topic_arn(&self.topic_arn)
            .send()
            .await
        {
            tracing::warn!(topic = %self.topic_arn, error = %aws_sdk_sns::error::DisplayErrorContext(&error), "could not delete a scratch topic");
        }
        self.queue.cleanup().await;
    }
}

/// A topic `outbox_<tag>_<suffix>` (`.fifo` and FIFO when `options.fifo`), a queue of the same
/// name subscribed to it with raw delivery, and a reader of the queue; the relay publishes to
/// the topic by name.
pub(crate) async fn scratch(url: &str, options: &ScratchOptions) -> Result<Scratch, Error> {
    let sdk = SnsConfig::sns_from_url(url)?.reader_sdk_config().await?;
    let sns = aws_sdk_sns::Client::new(&sdk);
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let mut name = options.unique_name();
    if options.fifo {
        name.push_str(".fifo");
    }
    let topic_arn = create_topic(&sns, &name, options.fifo).await?;
    let queue_url = match create_queue(&sqs, &name, options.fifo).await {
        Ok(u) => u,
        Err(e) => {
            let _ = sns.delete_topic().topic_arn(&topic_arn).send().await;
            return Err(e);
        }
    };
    let queue = SqsReader::new(sqs.clone(), queue_url.clone(), name.clone(), true);
    match subscribe_queue(&sns, &sqs, &topic_arn, &queue_url).await {
        Ok(subscription_arn) => Ok(Scratch {
            sink_url: url.to_string(),
            destination: name,
            reader: Box::new(SnsReader::new(queue, sns, topic_arn, subscription_arn)),
        }),
        Err(e) => {
            let mut reader = SnsReader::new(queue, sns, topic_arn, String::new());
            reader.cleanup().await;
            Err(e)
        }
    }
}
