//! SNS as a [`Service`] of the AWS batch sink: topics by name (their ARN built from the region
//! and the caller's account, read once with STS `GetCallerIdentity`) or by ARN, and
//! `PublishBatch`.

use async_trait::async_trait;
use aws_config::SdkConfig;
use outbox_core::SinkError;
use tokio::sync::OnceCell;

use crate::aws::attributes::{name_of, shorten, valid_name};
use crate::aws::batch::Entry;
use crate::aws::error::{call_failure, Failure};
use crate::aws::service::{Answer, CallError, Service, Target};
use crate::aws::AwsSink;

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
        name_of("sns", "topic", MAX_TOPIC_NAME, "ARN", destination).map(Self::Name)
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
        crate::aws::attributes::is_fifo(self.name())
    }
}

/// SNS for the batch sink. A message counts as published once `PublishBatch` lists it as
/// successful: SNS has then stored it for delivery to the topic's subscriptions. With raw
/// message delivery an SQS subscriber gets the headers as SQS message attributes.
pub struct SnsService {
    client: aws_sdk_sns::Client,
    sts: aws_sdk_sts::Client,
    region: String,
    /// (partition, account) of the credentials, read once, for ARNs of topics named by name.
    identity: OnceCell<(String, String)>,
}

impl AwsSink<SnsService> {
    /// The SDK client (for tests, readers and tools beside the sink).
    pub fn client(&self) -> &aws_sdk_sns::Client {
        &self.service().client
    }
}

impl Target for TopicRef {
    fn parse(destination: &str) -> Result<Self, SinkError> {
        Self::parse(destination)
    }

    fn rendered(&self) -> &str {
        match self {
            Self::Name(n) | Self::Arn(n) => n,
        }
    }

    fn is_fifo(&self) -> bool {
        TopicRef::is_fifo(self)
    }
}

#[async_trait]
impl Service for SnsService {
    const NAME: &'static str = "sns";
    const NOUN: &'static str = "topic";
    const CALL: &'static str = "PublishBatch";
    type Target = TopicRef;

    fn new(sdk: &SdkConfig) -> Self {
        Self {
            client: aws_sdk_sns::Client::new(sdk),
            sts: aws_sdk_sts::Client::new(sdk),
            region: sdk.region().map(|r| r.to_string()).unwrap_or_default(),
            identity: OnceCell::new(),
        }
    }

    /// The ARN of the topic `topic` names. Whether the topic exists is learnt from the
    /// publish itself (`NotFound`), so the relay needs no permission beyond `sns:Publish`.
    async fn resolve(&self, topic: &TopicRef) -> Result<String, SinkError> {
        let name = match topic {
            TopicRef::Arn(arn) => return Ok(arn.clone()),
            TopicRef::Name(name) => name,
        };
        let (partition, account) = self
            .identity
            .get_or_try_init(|| async {
                let out = self
                    .sts
                    .get_caller_identity()
                    .send()
                    .await
                    .map_err(|e| identity_error(&call_failure(&e)))?;
                let account = out.account().unwrap_or_default().to_string();
                let partition = out
                    .arn()
                    .and_then(|arn| arn.split(':').nth(1))
                    .unwrap_or("aws")
                    .to_string();
                if account.is_empty() {
                    return Err(SinkError::rejected(
                        "sns: STS GetCallerIdentity returned no account",
                    ));
                }
                Ok((partition, account))
            })
            .await?;
        Ok(format!(
            "arn:{partition}:sns:{}:{account}:{name}",
            self.region
        ))
    }

    fn resolve_timed_out(_topic: &TopicRef) -> SinkError {
        SinkError::unavailable("sns: STS GetCallerIdentity: no answer within the ack timeout")
    }

    /// One `PublishBatch` of `entries` to `arn`.
    async fn send(&self, arn: &str, entries: &[&Entry<'_>]) -> Result<Answer, CallError> {
        let request = entries
            .iter()
            .map(|e| request_entry(e))
            .collect::<Result<Vec<_>, _>>()
            .map_err(CallError::Entry)?;
        let out = self
            .client
            .publish_batch()
            .topic_arn(arn)
            .set_publish_batch_request_entries(Some(request))
            .send()
            .await
            .map_err(|e| CallError::Call(call_failure(&e)))?;
        Ok(Answer {
            ok: out
                .successful()
                .iter()
                .filter_map(|s| s.id().map(str::to_string))
                .collect(),
            failed: out.failed().iter().map(refusal).collect(),
        })
    }
}

/// The error every message to a topic named by name gets when the caller's account cannot be
/// read (STS `GetCallerIdentity`), which the topic's ARN needs.
fn identity_error(f: &Failure) -> SinkError {
    SinkError::new(
        f.class.kind(),
        format!(
            "sns: cannot read the caller's account (STS GetCallerIdentity), which a topic named \
             by name needs for its ARN: {}",
            f.text
        ),
    )
}

crate::aws::service::sdk_entries!("sns", aws_sdk_sns, PublishBatchRequestEntry, message);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::aws::error::{call_error, entry_error, Class};
    use crate::aws::service::Refusal;
    use outbox_core::SinkErrorKind;

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
            assert_eq!(e.kind, SinkErrorKind::Invalid, "{bad}");
        }
        let e = TopicRef::parse("a b").unwrap_err();
        assert_eq!(
            e.message,
            "sns: `a b` is not a topic name (1 to 256 characters of A-Z, a-z, 0-9, `_` and `-`, \
             and `.fifo` at the end of a FIFO topic's) nor a topic ARN"
        );
    }

    #[test]
    fn a_missing_topic_is_a_rejection_that_names_it() {
        let f = Failure {
            class: Class::Missing,
            text: "NotFound: Topic does not exist".into(),
        };
        let e = call_error::<SnsService>("orders", &f);
        assert_eq!(e.kind, SinkErrorKind::Rejected);
        assert!(
            e.message.starts_with("sns: no topic `orders`;"),
            "{}",
            e.message
        );
        let f = Failure {
            class: Class::Refused,
            text: "AuthorizationError".into(),
        };
        let e = call_error::<SnsService>("orders", &f);
        assert_eq!(
            e.message,
            "sns: PublishBatch to `orders` failed: AuthorizationError"
        );
    }

    #[test]
    fn entries_are_classified_by_code_and_fault() {
        let r = Refusal::of("InvalidParameter", Some("Message too long"), true);
        let e = entry_error::<SnsService>("t", &r);
        assert_eq!(e.kind, SinkErrorKind::Invalid);
        assert_eq!(
            e.message,
            "sns: topic `t` refused the message: InvalidParameter (sender's fault): Message too \
             long"
        );
        let r = Refusal::of("InternalError", None, false);
        assert_eq!(
            entry_error::<SnsService>("t", &r).kind,
            SinkErrorKind::Unavailable
        );
        let r = Refusal::of("KMSAccessDenied", None, true);
        assert_eq!(
            entry_error::<SnsService>("t", &r).kind,
            SinkErrorKind::Rejected
        );
    }
}
