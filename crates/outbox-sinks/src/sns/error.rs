//! SNS failures as sink errors: a missing topic is a rejection naming it, the service's own
//! trouble an outage, a refused message invalid (see [`crate::aws::error`]).

use outbox_core::SinkError;

use crate::aws::error::{entry_class, Class, Failure};

/// The error every message to a topic named by name gets when the caller's account cannot be
/// read (STS `GetCallerIdentity`), which the topic's ARN needs.
pub(crate) fn identity_error(f: &Failure) -> SinkError {
    SinkError::new(
        f.class.kind(),
        format!(
            "sns: cannot read the caller's account (STS GetCallerIdentity), which a topic named \
             by name needs for its ARN: {}",
            f.text
        ),
    )
}

/// The error every message of a failed `PublishBatch` to `topic` gets.
pub(crate) fn call_error(topic: &str, f: &Failure) -> SinkError {
    match f.class {
        Class::Missing => SinkError::rejected(format!(
            "sns: no topic `{topic}`; create it (or route the message elsewhere), then redrive \
             if the message ended failed ({})",
            f.text
        )),
        class => SinkError::new(
            class.kind(),
            format!("sns: PublishBatch to `{topic}` failed: {}", f.text),
        ),
    }
}

/// The error of one failed entry of a `PublishBatch` answer.
pub(crate) fn entry_error(
    topic: &str,
    code: &str,
    message: Option<&str>,
    sender_fault: bool,
) -> SinkError {
    let class = entry_class(code, sender_fault);
    let fault = if sender_fault {
        "sender's fault"
    } else {
        "service's fault"
    };
    SinkError::new(
        class.kind(),
        format!(
            "sns: topic `{topic}` refused the message: {code} ({fault}): {}",
            message.unwrap_or("no reason given")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::SinkErrorKind;

    #[test]
    fn a_missing_topic_is_a_rejection_that_names_it() {
        let f = Failure {
            class: Class::Missing,
            text: "NotFound: Topic does not exist".into(),
        };
        let e = call_error("orders", &f);
        assert_eq!(e.kind, SinkErrorKind::Rejected);
        assert!(e.message.contains("`orders`"), "{}", e.message);
    }

    #[test]
    fn entries_are_classified_by_code_and_fault() {
        assert_eq!(
            entry_error("t", "InvalidParameter", Some("Message too long"), true).kind,
            SinkErrorKind::Invalid
        );
        assert_eq!(
            entry_error("t", "InternalError", None, false).kind,
            SinkErrorKind::Unavailable
        );
        assert_eq!(
            entry_error("t", "KMSAccessDenied", None, true).kind,
            SinkErrorKind::Rejected
        );
    }
}
