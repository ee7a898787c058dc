//! What an SQS or SNS failure says: the service is unavailable, the queue or topic is missing,
//! one message's content is refused, or the service refused the call for another reason.
//!
//! The SDK's errors are read by their AWS error code (the same codes through either service's
//! client, whatever protocol the service speaks), so SQS and SNS share one table.

use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use outbox_core::{SinkError, SinkErrorKind};

use super::service::{Refusal, Service};

/// What kind of failure a call or a batch entry met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// No answer (connection refused or lost, timeout) or the service's own "try later"
    /// (throttling, internal error): unavailable, the only class that feeds the breaker.
    Outage,
    /// The queue or topic does not exist: rejected, with its name.
    Missing,
    /// A value in the request was refused (a parameter, a size, an attribute): the fault of a
    /// message. The sinks resend a refused batch one message per call to find which; a
    /// single message refused this way is invalid.
    Content,
    /// Any other refusal (permissions, KMS, a disabled endpoint, a code not known here):
    /// rejected. Never an outage: an unknown refusal classed as one could hold a message, and
    /// through the breaker the relay, for ever.
    Refused,
}

impl Class {
    /// The sink error kind of this class for one message.
    pub(crate) fn kind(self) -> SinkErrorKind {
        match self {
            Class::Outage => SinkErrorKind::Unavailable,
            Class::Missing | Class::Refused => SinkErrorKind::Rejected,
            Class::Content => SinkErrorKind::Invalid,
        }
    }
}

/// A failed call: its class and a text for the message's `last_error` (sanitised later by
/// `SinkError`; it never holds the payload).
#[derive(Debug, Clone)]
pub struct Failure {
    pub class: Class,
    pub text: String,
}

/// The class of an AWS error code, when the code says it. The SQS codes come either as the
/// query protocol's (`AWS.SimpleQueueService.NonExistentQueue`) or as the JSON protocol's
/// (`QueueDoesNotExist`); SNS's as `NotFound` or `NotFoundException`.
pub(crate) fn code_class(code: &str) -> Option<Class> {
    let c = code.strip_prefix("AWS.SimpleQueueService.").unwrap_or(code);
    let c = c.strip_suffix("Exception").unwrap_or(c);
    let c = c.strip_prefix("KMS.").unwrap_or(c);
    Some(match c {
        // The throttling and transient codes the SDK's own retry classifier knows, and each
        // service's own "try later".
        "Throttling"
        | "Throttled"
        | "RequestThrottled"
        | "TooManyRequests"
        | "ProvisionedThroughputExceeded"
        | "RequestLimitExceeded"
        | "BandwidthLimitExceeded"
        | "LimitExceeded"
        | "SlowDown"
        | "PriorRequestNotComplete"
        | "RequestTimeout"
        | "KmsThrottled"
        | "KMSThrottling"
        | "ServiceUnavailable"
        | "InternalError"
        | "InternalFailure"
        | "InternalServerError" => Class::Outage,
        "NonExistentQueue" | "QueueDoesNotExist" | "NotFound" => Class::Missing,
        "InvalidParameterValue"
        | "InvalidParameter"
        | "ParameterValueInvalid"
        | "InvalidMessageContents"
        | "MessageTooLong"
        | "BatchRequestTooLong"
        | "InvalidAttributeName"
        | "InvalidAttributeValue"
        | "Validation" => Class::Content,
        _ => return None,
    })
}

/// The class and text of a failed SDK call.
pub(crate) fn call_failure<E>(err: &SdkError<E, HttpResponse>) -> Failure
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match err {
        SdkError::ServiceError(se) => {
            let status = se.raw().status().as_u16();
            let code = se.err().code().unwrap_or("unknown");
            let class = code_class(code).unwrap_or(if status >= 500 {
                Class::Outage
            } else {
                Class::Refused
            });
            let text = match se.err().message() {
                Some(m) => format!("{code} (HTTP {status}): {m}"),
                None => format!("{code} (HTTP {status})"),
            };
            Failure { class, text }
        }
        SdkError::TimeoutError(_) => Failure {
            class: Class::Outage,
            text: "no answer within the ack timeout (SDK retries included)".into(),
        },
        SdkError::DispatchFailure(d) => Failure {
            // Connection refused, reset, closed before the answer came (which the SDK files as
            // a transient "other" error, not an I/O one) or timed out. Other dispatch failures
            // are the client's: no credentials in the chain, an endpoint it cannot use.
            class: if d.is_io()
                || d.is_timeout()
                || d.as_other() == Some(aws_config::retry::ErrorKind::TransientError)
            {
                Class::Outage
            } else {
                Class::Refused
            },
            text: DisplayErrorContext(err).to_string(),
        },
        SdkError::ResponseError(r) => Failure {
            class: if r.raw().status().as_u16() >= 500 {
                Class::Outage
            } else {
                Class::Refused
            },
            text: DisplayErrorContext(err).to_string(),
        },
        _ => Failure {
            class: Class::Refused,
            text: DisplayErrorContext(err).to_string(),
        },
    }
}

/// The class of a failed entry of a batch answer: the service's own fault (`SenderFault`
/// false) is an outage; a throttling code too; a content code is the message's fault; a
/// missing queue or topic is a rejection naming it; anything else the sender caused is a
/// rejection.
pub(crate) fn entry_class(code: &str, sender_fault: bool) -> Class {
    match code_class(code) {
        Some(class) => class,
        None if !sender_fault => Class::Outage,
        None => Class::Refused,
    }
}

/// The error every message of a failed batch call to `target` (as its destination rendered it)
/// gets: a missing queue or topic is a rejection naming it, anything else keeps its class.
pub(crate) fn call_error<S: Service>(target: &str, f: &Failure) -> SinkError {
    let (service, noun) = (S::NAME, S::NOUN);
    match f.class {
        Class::Missing => SinkError::rejected(format!(
            "{service}: no {noun} `{target}`; create it (or route the message elsewhere), then \
             redrive if the message ended failed ({})",
            f.text
        )),
        class => SinkError::new(
            class.kind(),
            format!("{service}: {} to `{target}` failed: {}", S::CALL, f.text),
        ),
    }
}

/// The error of one refused entry of a batch answer (see [`entry_class`]).
pub(crate) fn entry_error<S: Service>(target: &str, r: &Refusal) -> SinkError {
    let class = entry_class(&r.code, r.sender_fault);
    let fault = if r.sender_fault {
        "sender's fault"
    } else {
        "service's fault"
    };
    SinkError::new(
        class.kind(),
        format!(
            "{}: {} `{target}` refused the message: {} ({fault}): {}",
            S::NAME,
            S::NOUN,
            r.code,
            r.message.as_deref().unwrap_or("no reason given")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_of_both_protocols_and_services_are_classified() {
        for c in [
            "AWS.SimpleQueueService.NonExistentQueue",
            "QueueDoesNotExist",
            "NotFound",
            "NotFoundException",
        ] {
            assert_eq!(code_class(c), Some(Class::Missing), "{c}");
        }
        for c in [
            "RequestThrottled",
            "ThrottlingException",
            "Throttled",
            "KMS.ThrottlingException",
            "KMSThrottling",
            "InternalError",
            "ServiceUnavailable",
        ] {
            assert_eq!(code_class(c), Some(Class::Outage), "{c}");
        }
        for c in [
            "InvalidParameterValue",
            "InvalidParameter",
            "AWS.SimpleQueueService.BatchRequestTooLong",
            "InvalidMessageContents",
            "ValidationException",
        ] {
            assert_eq!(code_class(c), Some(Class::Content), "{c}");
        }
        for c in [
            "AccessDenied",
            "AuthorizationError",
            "KMS.AccessDeniedException",
            "Whatever",
        ] {
            assert_eq!(code_class(c), None, "{c}");
        }
    }

    #[test]
    fn batch_entries_are_the_services_fault_only_when_it_says_so() {
        assert_eq!(entry_class("InternalError", false), Class::Outage);
        assert_eq!(entry_class("SomethingNew", false), Class::Outage);
        assert_eq!(entry_class("SomethingNew", true), Class::Refused);
        assert_eq!(entry_class("AccessDenied", true), Class::Refused);
        assert_eq!(entry_class("InvalidParameterValue", true), Class::Content);
        assert_eq!(entry_class("RequestThrottled", true), Class::Outage);
        assert_eq!(Class::Content.kind(), SinkErrorKind::Invalid);
        assert_eq!(Class::Missing.kind(), SinkErrorKind::Rejected);
        assert_eq!(Class::Refused.kind(), SinkErrorKind::Rejected);
        assert_eq!(Class::Outage.kind(), SinkErrorKind::Unavailable);
    }
}
