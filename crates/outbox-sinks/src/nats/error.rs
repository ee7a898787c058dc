//! Which JetStream publish failures are worth retrying.

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use outbox_core::SinkError;

/// Maps a publish or acknowledgement failure for `subject` to a retriable or permanent error.
pub(crate) fn classify(subject: &str, err: &PublishError) -> SinkError {
    match err.kind() {
        PublishErrorKind::StreamNotFound => SinkError::transient(format!(
            "nats: no JetStream stream captures subject `{subject}`; create a stream whose subjects \
             include it (the message stays pending and is retried)"
        )),
        PublishErrorKind::MaxPayloadExceeded => {
            SinkError::permanent(format!("nats: message for `{subject}` exceeds the server's max_payload"))
        }
        PublishErrorKind::TimedOut => {
            SinkError::transient(format!("nats: no acknowledgement for `{subject}` in time"))
        }
        PublishErrorKind::BrokenPipe => SinkError::transient(format!("nats: connection lost publishing to `{subject}`")),
        kind => SinkError::transient(format!("nats: publish to `{subject}` failed: {kind}")),
    }
}
