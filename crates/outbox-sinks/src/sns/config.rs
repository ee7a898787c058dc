//! Configuration of the SNS sink (`sns://?region=…&endpoint=…`) and the topics a destination
//! names.

use outbox_core::SinkError;

use crate::aws::attributes::{is_fifo, shorten, valid_name};

/// Options of an `sns://` URL; see [`crate::aws::AwsConfig`].
pub type SnsConfig = crate::aws::AwsConfig;

/// Longest SNS topic name (`.fifo` included).
const MAX_TOPIC_NAME: usize = 256;

/// What a rendered destination names: a topic by name (its ARN is built from the caller's
/// account, read once with STS `GetCallerIdentity`, and the sink's region) or by ARN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicRef {
    /// A topic name in the sink's region and the credentials' account.
    Name(String),
    /// A topic ARN, `arn:PARTITION:sns:REGION:ACCOUNT:NAME`.
    Arn(String),
}

impl TopicRef {
    /// Reads a destination: `arn:` starts an ARN (of an SNS topic), anything else is a name of
    /// 1 to 256 characters of `A-Z a-z 0-9 _ -` (a FIFO topic's ends with `.fifo`); anything
    /// else is an invalid message, since no topic can have it.
    pub fn parse(destination: &str) -> Result<Self, SinkError> {
        if destination.starts_with("arn:") {
            let parts: Vec<&str> = destination.splitn(6, ':').collect();
            let ok = parts.len() == 6
                && parts[2] == "sns"
                && !parts[1].is_empty()
                && !parts[3].is_empty()
                && !parts[4].is_empty()
                && valid_name(parts[5], MAX_TOPIC_NAME);
            return if ok {
                Ok(Self::Arn(destination.to_string()))
            } else {
                Err(SinkError::invalid(format!(
                    "sns: `{}` is not a topic ARN (arn:PARTITION:sns:REGION:ACCOUNT:NAME)",
                    shorten(destination)
                )))
            };
        }
        if valid_name(destination, MAX_TOPIC_NAME) {
            Ok(Self::Name(destination.to_string()))
        } else {
            Err(SinkError::invalid(format!(
                "sns: `{}` is not a topic name (1 to 256 characters of A-Z, a-z, 0-9, `_` and \
                 `-`, and `.fifo` at the end of a FIFO topic's) nor a topic ARN",
                shorten(destination)
            )))
        }
    }

    /// The topic's name (the last field of an ARN).
    pub fn name(&self) -> &str {
        match self {
            Self::Name(n) => n,
            Self::Arn(a) => a.rsplit(':').next().unwrap_or_default(),
        }
    }

    /// Whether the topic is FIFO (its name ends with `.fifo`, as SNS requires).
    pub fn is_fifo(&self) -> bool {
        is_fifo(self.name())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_and_arns_are_both_accepted() {
        assert_eq!(
            TopicRef::parse("orders").unwrap(),
            TopicRef::Name("orders".into())
        );
        let arn = "arn:aws:sns:us-east-1:123456789012:orders.fifo";
        let t = TopicRef::parse(arn).unwrap();
        assert_eq!(t, TopicRef::Arn(arn.into()));
        assert_eq!(t.name(), "orders.fifo");
        assert!(t.is_fifo());
        assert!(!TopicRef::parse("orders").unwrap().is_fifo());
    }

    #[test]
    fn impossible_names_and_arns_are_invalid_messages() {
        for bad in [
            "",
            "a.b",
            "a b",
            "arn:aws:sqs:us-east-1:1:q",
            "arn:aws:sns:us-east-1:1",
            "arn:aws:sns:us-east-1:1:a/b",
        ] {
            let e = TopicRef::parse(bad).unwrap_err();
            assert_eq!(e.kind, outbox_core::SinkErrorKind::Invalid, "{bad}");
        }
    }
}
