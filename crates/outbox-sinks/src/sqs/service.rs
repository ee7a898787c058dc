//! SQS as a [`Service`] of the AWS batch sink: queues by name (their URL looked up with
//! `GetQueueUrl` once, then cached) or by URL, and `SendMessageBatch`.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use aws_config::SdkConfig;
use outbox_core::SinkError;

use crate::aws::attributes::{name_of, shorten, valid_name};
use crate::aws::batch::Entry;
use crate::aws::error::{call_failure, Class, Failure};
use crate::aws::service::{Answer, CallError, Service, Target};
use crate::aws::AwsSink;

/// Longest SQS queue name (`.fifo` included).
const MAX_QUEUE_NAME: usize = 80;

/// What a rendered destination names: a queue by name (resolved once to its URL with
/// `GetQueueUrl`, then cached) or by URL (used as it is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueRef {
    /// A queue name in the sink's region and account.
    Name(String),
    /// A queue URL, e.g. `https://sqs.us-east-1.amazonaws.com/123456789012/orders`.
    Url(String),
}

impl QueueRef {
    /// Reads a destination: `http://` or `https://` starts a URL, anything else is a name.
    /// A name must be 1 to 80 characters of `A-Z a-z 0-9 _ -` (a FIFO queue's ends with
    /// `.fifo`); anything else is an invalid message, since no queue can have it.
    pub fn parse(destination: &str) -> Result<Self, SinkError> {
        if destination.starts_with("https://") || destination.starts_with("http://") {
            let name = destination.rsplit('/').next().unwrap_or_default();
            return match valid_name(name, MAX_QUEUE_NAME) {
                true => Ok(Self::Url(destination.to_string())),
                false => Err(SinkError::invalid(format!(
                    "sqs: `{}` is not a queue URL (…/ACCOUNT/QUEUE_NAME)",
                    shorten(destination)
                ))),
            };
        }
        name_of("sqs", "queue", MAX_QUEUE_NAME, "URL", destination).map(Self::Name)
    }

    /// The queue's name (the last segment of a URL).
    pub fn name(&self) -> &str {
        match self {
            Self::Name(n) => n,
            Self::Url(u) => u.rsplit('/').next().unwrap_or_default(),
        }
    }

    /// Whether the queue is FIFO (its name ends with `.fifo`, as SQS requires).
    pub fn is_fifo(&self) -> bool {
        crate::aws::attributes::is_fifo(self.name())
    }
}

/// SQS for the batch sink. A message counts as published once `SendMessageBatch` lists it
/// as successful: SQS has then stored it redundantly.
pub struct SqsService {
    client: aws_sdk_sqs::Client,
    region: String,
    /// Queue name → URL, filled by `GetQueueUrl`. An entry is dropped when SQS says its queue
    /// does not exist, so a queue deleted and created again is found again.
    urls: Mutex<HashMap<String, String>>,
}

impl SqsService {
    fn cached(&self, name: &str) -> Option<String> {
        self.urls.lock().ok()?.get(name).cloned()
    }
}

impl AwsSink<SqsService> {
    /// The SDK client (for tests, readers and tools beside the sink).
    pub fn client(&self) -> &aws_sdk_sqs::Client {
        &self.service().client
    }
}

impl Target for QueueRef {
    fn parse(destination: &str) -> Result<Self, SinkError> {
        Self::parse(destination)
    }

    fn rendered(&self) -> &str {
        match self {
            Self::Name(n) | Self::Url(n) => n,
        }
    }

    fn is_fifo(&self) -> bool {
        QueueRef::is_fifo(self)
    }
}

#[async_trait]
impl Service for SqsService {
    const NAME: &'static str = "sqs";
    const NOUN: &'static str = "queue";
    const CALL: &'static str = "SendMessageBatch";
    type Target = QueueRef;

    fn new(sdk: &SdkConfig) -> Self {
        Self {
            client: aws_sdk_sqs::Client::new(sdk),
            region: sdk.region().map(|r| r.to_string()).unwrap_or_default(),
            urls: Mutex::new(HashMap::new()),
        }
    }

    /// The URL of the queue `queue` names.
    async fn resolve(&self, queue: &QueueRef) -> Result<String, SinkError> {
        let name = match queue {
            QueueRef::Url(url) => return Ok(url.clone()),
            QueueRef::Name(name) => name,
        };
        if let Some(url) = self.cached(name) {
            return Ok(url);
        }
        let out = self
            .client
            .get_queue_url()
            .queue_name(name)
            .send()
            .await
            .map_err(|e| lookup_error(name, &self.region, &call_failure(&e)))?;
        let url = out.queue_url().ok_or_else(|| {
            SinkError::rejected(format!("sqs: GetQueueUrl for `{name}` returned no URL"))
        })?;
        if let Ok(mut urls) = self.urls.lock() {
            urls.insert(name.clone(), url.to_string());
        }
        Ok(url.to_string())
    }

    fn resolve_timed_out(queue: &QueueRef) -> SinkError {
        SinkError::unavailable(format!(
            "sqs: GetQueueUrl for `{}`: no answer within the ack timeout",
            queue.name()
        ))
    }

    /// One `SendMessageBatch` of `entries` to `url`.
    async fn send(&self, url: &str, entries: &[&Entry<'_>]) -> Result<Answer, CallError> {
        let request = entries
            .iter()
            .map(|e| request_entry(e))
            .collect::<Result<Vec<_>, _>>()
            .map_err(CallError::Entry)?;
        let out = self
            .client
            .send_message_batch()
            .queue_url(url)
            .set_entries(Some(request))
            .send()
            .await
            .map_err(|e| CallError::Call(call_failure(&e)))?;
        Ok(Answer {
            ok: out
                .successful()
                .iter()
                .map(|s| s.id().to_string())
                .collect(),
            failed: out.failed().iter().map(refusal).collect(),
        })
    }

    /// A queue that no longer exists is looked up again next time: it may be created again.
    fn call_failed(&self, queue: &QueueRef, failure: &Failure) {
        if failure.class != Class::Missing {
            return;
        }
        if let (QueueRef::Name(name), Ok(mut urls)) = (queue, self.urls.lock()) {
            urls.remove(name);
        }
    }
}

/// The error of a failed `GetQueueUrl` for the queue `name`.
pub(crate) fn lookup_error(name: &str, region: &str, f: &Failure) -> SinkError {
    match f.class {
        Class::Missing => SinkError::rejected(format!(
            "sqs: no queue named `{name}` in {region} for these credentials; create it (or route \
             the message elsewhere), then redrive if the message ended failed"
        )),
        // A name SQS refuses can never be resolved; no retry helps.
        Class::Content => SinkError::invalid(format!(
            "sqs: GetQueueUrl refused the queue name `{name}`: {}",
            f.text
        )),
        class => SinkError::new(
            class.kind(),
            format!("sqs: GetQueueUrl for `{name}` failed: {}", f.text),
        ),
    }
}

crate::aws::service::sdk_entries!(
    "sqs",
    aws_sdk_sqs,
    SendMessageBatchRequestEntry,
    message_body
);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::aws::error::{call_error, entry_error};
    use crate::aws::service::Refusal;
    use outbox_core::SinkErrorKind;

    #[test]
    fn names_and_urls_are_both_accepted() {
        assert_eq!(
            QueueRef::parse("orders").unwrap(),
            QueueRef::Name("orders".into())
        );
        let fifo = QueueRef::parse("orders-1.fifo").unwrap();
        assert!(fifo.is_fifo());
        let url = "http://127.0.0.1:4566/123456789012/orders.fifo";
        let u = QueueRef::parse(url).unwrap();
        assert_eq!(u, QueueRef::Url(url.into()));
        assert_eq!(u.name(), "orders.fifo");
        assert!(u.is_fifo());
        assert!(!QueueRef::parse("orders").unwrap().is_fifo());
    }

    #[test]
    fn impossible_names_are_invalid_messages() {
        for bad in [
            "",
            ".fifo",
            "a.b",
            "a b",
            "a/b",
            &"q".repeat(81),
            "https://host/",
        ] {
            let e = QueueRef::parse(bad).unwrap_err();
            assert_eq!(e.kind, SinkErrorKind::Invalid, "{bad}");
        }
        let e = QueueRef::parse("a b").unwrap_err();
        assert_eq!(
            e.message,
            "sqs: `a b` is not a queue name (1 to 80 characters of A-Z, a-z, 0-9, `_` and `-`, \
             and `.fifo` at the end of a FIFO queue's) nor a queue URL"
        );
    }

    #[test]
    fn a_missing_queue_is_a_rejection_that_names_it() {
        let f = Failure {
            class: Class::Missing,
            text: "QueueDoesNotExist".into(),
        };
        let e = lookup_error("orders", "us-east-1", &f);
        assert_eq!(e.kind, SinkErrorKind::Rejected);
        assert!(e.message.contains("`orders`"), "{}", e.message);
        let e = call_error::<SqsService>("https://h/1/orders", &f);
        assert_eq!(e.kind, SinkErrorKind::Rejected);
        assert!(
            e.message.starts_with("sqs: no queue `https://h/1/orders`;"),
            "{}",
            e.message
        );
        let f = Failure {
            class: Class::Outage,
            text: "ServiceUnavailable".into(),
        };
        let e = call_error::<SqsService>("orders", &f);
        assert_eq!(e.kind, SinkErrorKind::Unavailable);
        assert_eq!(
            e.message,
            "sqs: SendMessageBatch to `orders` failed: ServiceUnavailable"
        );
    }

    #[test]
    fn entries_are_classified_by_code_and_fault() {
        let e = entry_error::<SqsService>("q", &Refusal::of("InternalError", None, false));
        assert_eq!(e.kind, SinkErrorKind::Unavailable);
        assert_eq!(
            e.message,
            "sqs: queue `q` refused the message: InternalError (service's fault): no reason given"
        );
        let r = Refusal::of("InvalidParameterValue", Some("too long"), true);
        assert_eq!(
            entry_error::<SqsService>("q", &r).kind,
            SinkErrorKind::Invalid
        );
        let r = Refusal::of("KMS.AccessDeniedException", None, true);
        assert_eq!(
            entry_error::<SqsService>("q", &r).kind,
            SinkErrorKind::Rejected
        );
    }
}
