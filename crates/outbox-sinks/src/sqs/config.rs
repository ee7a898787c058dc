//! Configuration of the SQS sink (`sqs://?region=…&endpoint=…`) and the queues a destination
//! names.

use outbox_core::SinkError;

use crate::aws::attributes::{is_fifo, shorten, valid_name};

/// Options of an `sqs://` URL; see [`crate::aws::AwsConfig`].
pub type SqsConfig = crate::aws::AwsConfig;

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
        if valid_name(destination, MAX_QUEUE_NAME) {
            Ok(Self::Name(destination.to_string()))
        } else {
            Err(SinkError::invalid(format!(
                "sqs: `{}` is not a queue name (1 to 80 characters of A-Z, a-z, 0-9, `_` and \
                 `-`, and `.fifo` at the end of a FIFO queue's) nor a queue URL",
                shorten(destination)
            )))
        }
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
        is_fifo(self.name())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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
            assert_eq!(e.kind, outbox_core::SinkErrorKind::Invalid, "{bad}");
        }
    }
}
