//! SQS failures as sink errors: a missing queue is a rejection naming it, the service's own
//! trouble an outage, a refused message invalid (see [`crate::aws::error`]).

use outbox_core::SinkError;

use crate::aws::error::{entry_class, Class, Failure};

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

/// The error every message of a failed `SendMessageBatch` to `queue` gets.
pub(crate) fn call_error(queue: &str, f: &Failure) -> SinkError {
    match f.class {
        Class::Missing => SinkError::rejected(format!(
            "sqs: no queue `{queue}`; create it (or route the message elsewhere), then redrive \
             if the message ended failed ({})",
            f.text
        )),
        class => SinkError::new(
            class.kind(),
            format!("sqs: SendMessageBatch to `{queue}` failed: {}", f.text),
        ),
    }
}

/// The error of one failed entry of a `SendMessageBatch` answer.
pub(crate) fn entry_error(
    queue: &str,
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
            "sqs: queue `{queue}` refused the message: {code} ({fault}): {}",
            message.unwrap_or("no reason given")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::SinkErrorKind;

    #[test]
    fn a_missing_queue_is_a_rejection_that_names_it() {
        let f = Failure {
            class: Class::Missing,
            text: "QueueDoesNotExist".into(),
        };
        let e = lookup_error("orders", "us-east-1", &f);
        assert_eq!(e.kind, SinkErrorKind::Rejected);
        assert!(e.message.contains("`orders`"), "{}", e.message);
        let e = call_error("https://h/1/orders", &f);
        assert_eq!(e.kind, SinkErrorKind::Rejected);
        assert!(e.message.contains("orders"), "{}", e.message);
    }

    #[test]
    fn entries_are_classified_by_code_and_fault() {
        assert_eq!(
            entry_error("q", "InternalError", None, false).kind,
            SinkErrorKind::Unavailable
        );
        assert_eq!(
            entry_error("q", "InvalidParameterValue", Some("too long"), true).kind,
            SinkErrorKind::Invalid
        );
        assert_eq!(
            entry_error("q", "KMS.AccessDeniedException", None, true).kind,
            SinkErrorKind::Rejected
        );
    }
}
