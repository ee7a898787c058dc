//! What a JetStream publish failure says: the broker is unavailable, or it rejected this message.

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::ErrorCode;
use outbox_core::{SinkError, SinkErrorKind};

use super::denied::Denied;

/// Maps a publish or acknowledgement failure for `subject` to a [`SinkError`] kind.
///
/// Only failures that mean "no answer from the broker" are [`SinkErrorKind::Unavailable`] (they
/// feed the circuit breaker): a timeout, a lost connection, the client's own ack window full,
/// and JetStream saying its cluster or the stream is offline. An answer that refuses the message
/// is [`SinkErrorKind::Rejected`]: JetStream's "no responders" to a publish means no stream
/// captures the subject. A message larger than the server or the stream accepts is
/// [`SinkErrorKind::Invalid`]. Anything unrecognised is a rejection, never an outage: it spends
/// the message's attempts and ends `failed` with its text, where calling it transient could
/// retry one bad message for ever.
///
/// `denied` is the connection's memory of publish permissions violations: NATS answers a denied
/// publish with nothing but an asynchronous error, so its acknowledgement times out, and that
/// timeout is a rejection (permission denied), not an outage.
pub(crate) fn classify(subject: &str, err: &PublishError, denied: &Denied) -> SinkError {
    match err.kind() {
        PublishErrorKind::TimedOut if denied.recently(subject) => SinkError::rejected(format!(
            "nats: the server denied this relay permission to publish to `{subject}`; grant the \
             relay's user publish permission for it, then redrive if the message ended failed"
        )),
        PublishErrorKind::StreamNotFound => SinkError::rejected(format!(
            "nats: no JetStream stream captures subject `{subject}`; create a stream whose \
             subjects include it, then redrive if the message ended failed"
        )),
        PublishErrorKind::MaxPayloadExceeded => SinkError::invalid(format!(
            "nats: message for `{subject}` exceeds the server's max_payload"
        )),
        PublishErrorKind::TimedOut => {
            SinkError::unavailable(format!("nats: no acknowledgement for `{subject}` in time"))
        }
        PublishErrorKind::BrokenPipe => {
            SinkError::unavailable(format!("nats: connection lost publishing to `{subject}`"))
        }
        PublishErrorKind::MaxAckPending => SinkError::unavailable(format!(
            "nats: too many acknowledgements outstanding publishing to `{subject}`"
        )),
        kind => match jetstream_error(err) {
            Some(js) => {
                let kind = jetstream_kind(js.code(), js.error_code());
                SinkError::new(
                    kind,
                    format!("nats: JetStream refused the message for `{subject}`: {js}"),
                )
            }
            None => SinkError::rejected(format!("nats: publish to `{subject}` failed: {kind}")),
        },
    }
}

/// The JetStream API error in a publish error's source chain, if the server sent one.
fn jetstream_error(err: &PublishError) -> Option<&async_nats::jetstream::Error> {
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        if let Some(js) = e.downcast_ref::<async_nats::jetstream::Error>() {
            return Some(js);
        }
        source = e.source();
    }
    None
}

/// The kind of a JetStream API error answered to a publish: `status` is its HTTP-like code,
/// `code` JetStream's own error code.
fn jetstream_kind(status: usize, code: ErrorCode) -> SinkErrorKind {
    match code {
        // The stream's max_msg_size: no retry can help.
        ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM => SinkErrorKind::Invalid,
        ErrorCode::CLUSTER_NOT_AVAILABLE
        | ErrorCode::JETSTREAM_NOT_ENABLED
        | ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT
        | ErrorCode::STREAM_OFFLINE
        | ErrorCode::INSUFFICIENT_RESOURCES
        | ErrorCode::TEMP_STORAGE_FAILED => SinkErrorKind::Unavailable,
        // Limits of one stream or account (storage full, maximum messages, sealed stream) and
        // every other refusal: other subjects may still flow.
        _ if status == 503 => SinkErrorKind::Unavailable,
        _ => SinkErrorKind::Rejected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_stream_is_a_rejection_and_timeouts_are_outages() {
        let no_stream = classify(
            "a.b",
            &PublishError::new(PublishErrorKind::StreamNotFound),
            &Denied::default(),
        );
        assert_eq!(no_stream.kind, SinkErrorKind::Rejected);
        assert!(no_stream.message.contains("`a.b`"), "{}", no_stream.message);
        for kind in [
            PublishErrorKind::TimedOut,
            PublishErrorKind::BrokenPipe,
            PublishErrorKind::MaxAckPending,
        ] {
            assert_eq!(
                classify("a.b", &PublishError::new(kind), &Denied::default()).kind,
                SinkErrorKind::Unavailable,
                "{kind:?}"
            );
        }
        assert_eq!(
            classify(
                "a.b",
                &PublishError::new(PublishErrorKind::MaxPayloadExceeded),
                &Denied::default()
            )
            .kind,
            SinkErrorKind::Invalid
        );
    }

    #[test]
    fn a_timeout_on_a_subject_the_server_denied_is_a_rejection() {
        let denied = Denied::default();
        denied.note("Permissions Violation for Publish to \"a.secret\"");
        let e = classify(
            "a.secret",
            &PublishError::new(PublishErrorKind::TimedOut),
            &denied,
        );
        assert_eq!(e.kind, SinkErrorKind::Rejected);
        assert!(e.message.contains("permission"), "{}", e.message);
        let other = classify(
            "a.b",
            &PublishError::new(PublishErrorKind::TimedOut),
            &denied,
        );
        assert_eq!(other.kind, SinkErrorKind::Unavailable);
    }

    #[test]
    fn the_catch_all_is_a_rejection_not_an_outage() {
        for kind in [
            PublishErrorKind::Other,
            PublishErrorKind::WrongLastMessageId,
            PublishErrorKind::WrongLastSequence,
        ] {
            assert_eq!(
                classify("a.b", &PublishError::new(kind), &Denied::default()).kind,
                SinkErrorKind::Rejected,
                "{kind:?}"
            );
        }
    }

    #[test]
    fn jetstream_answers_are_classified_by_code() {
        assert_eq!(
            jetstream_kind(400, ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM),
            SinkErrorKind::Invalid
        );
        assert_eq!(
            jetstream_kind(503, ErrorCode::CLUSTER_NOT_AVAILABLE),
            SinkErrorKind::Unavailable
        );
        assert_eq!(
            jetstream_kind(503, ErrorCode(1)),
            SinkErrorKind::Unavailable
        );
        assert_eq!(
            jetstream_kind(400, ErrorCode::STORAGE_RESOURCES_EXCEEDED),
            SinkErrorKind::Rejected
        );
        assert_eq!(
            jetstream_kind(500, ErrorCode::STREAM_STORE_FAILED),
            SinkErrorKind::Rejected
        );
    }
}
