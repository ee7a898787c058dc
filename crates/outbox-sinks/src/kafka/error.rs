//! What a Kafka produce failure says: the broker is unavailable, or it refused this message.

use outbox_core::SinkError;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Maps a failed produce (refused on enqueue, or failed in its delivery report) of a message for
/// `topic` to a [`SinkError`].
///
/// Only "no answer from the broker" is [`SinkErrorKind::Unavailable`] (it feeds the circuit
/// breaker): the connection lost or refused, every broker down, a timeout, no leader for the
/// partition right now, too few in-sync replicas, the client's own queue full because the
/// broker does not drain it, and the producer reset after a fatal error (this message was never
/// refused; it waits for a new producer). A message the broker can never take as it is
/// (larger than `message.max.bytes`, a record it calls invalid, a topic name it refuses) is
/// [`SinkErrorKind::Invalid`]. Anything else is [`SinkErrorKind::Rejected`]: a missing topic,
/// missing permissions, and every code this function does not know, which spends the message's
/// attempts and ends `failed` with its text instead of holding it (and the relay) as an outage.
pub(crate) fn classify(topic: &str, err: &KafkaError) -> SinkError {
    match err.rdkafka_error_code() {
        Some(code) => classify_code(topic, code),
        None => SinkError::rejected(format!("kafka: producing to topic `{topic}` failed: {err}")),
    }
}

/// The kind and message of a produce error code for `topic`.
pub(crate) fn classify_code(topic: &str, code: RDKafkaErrorCode) -> SinkError {
    use RDKafkaErrorCode as C;
    match code {
        C::UnknownTopic | C::UnknownTopicOrPartition => SinkError::rejected(missing_topic(topic)),
        C::TopicAuthorizationFailed | C::ClusterAuthorizationFailed => {
            SinkError::rejected(format!(
                "kafka: the broker denied this relay access to topic `{topic}` ({code}); grant \
                 it write permission, then redrive if the message ended failed"
            ))
        }
        C::MessageSizeTooLarge | C::InvalidMessageSize | C::MessageBatchTooLarge => {
            SinkError::invalid(format!(
                "kafka: message for topic `{topic}` exceeds the size the producer or the broker \
                 accepts (message.max.bytes / max.message.bytes)"
            ))
        }
        C::InvalidTopic | C::InvalidRecord | C::InvalidMessage | C::BadMessage => {
            SinkError::invalid(format!(
                "kafka: the message for topic `{topic}` can never be produced as it is: {code}"
            ))
        }
        // The idempotent producer's own state: a fatal error stops it (the gap-less guarantee
        // purges every queued message), and a broker that lost its producer state (a restart
        // without it) answers with these sequence errors. The message itself was not refused.
        C::Fatal
        | C::GaplessGuarantee
        | C::PurgeQueue
        | C::PurgeInflight
        | C::BrokerDestroy
        | C::OutOfOrderSequenceNumber
        | C::UnknownProducerId
        | C::InvalidProducerEpoch => SinkError::unavailable(format!(
            "kafka: not produced to topic `{topic}`: the producer stopped after a fatal error \
                 ({code}) and is being replaced; retried"
        )),
        C::BrokerTransportFailure
        | C::AllBrokersDown
        | C::Resolve
        | C::MessageTimedOut
        | C::RequestTimedOut
        | C::OperationTimedOut
        | C::TimedOutQueue
        | C::QueueFull
        | C::NetworkException
        | C::LeaderNotAvailable
        | C::NotLeaderForPartition
        | C::BrokerNotAvailable
        | C::NotEnoughReplicas
        | C::NotEnoughReplicasAfterAppend
        | C::KafkaStorageError
        | C::UnknownPartition => SinkError::unavailable(format!(
            "kafka: broker unavailable producing to topic `{topic}`: {code}"
        )),
        _ => SinkError::rejected(format!(
            "kafka: the broker refused the message for topic `{topic}`: {code}"
        )),
    }
}

/// The rejection of a message whose topic does not exist.
pub(crate) fn missing_topic(topic: &str) -> String {
    format!(
        "kafka: topic `{topic}` does not exist; create it (or add ?create_topics=true to the \
         sink URL), then redrive if the message ended failed"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::SinkErrorKind;
    use RDKafkaErrorCode as C;

    #[test]
    fn a_missing_topic_is_a_rejection_that_names_it() {
        for code in [C::UnknownTopic, C::UnknownTopicOrPartition] {
            let e = classify_code("orders.placed", code);
            assert_eq!(e.kind, SinkErrorKind::Rejected);
            assert!(
                e.message.contains("topic `orders.placed` does not exist"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn outages_feed_the_breaker_and_oversized_messages_fail_at_once() {
        for code in [
            C::BrokerTransportFailure,
            C::AllBrokersDown,
            C::MessageTimedOut,
            C::QueueFull,
            C::NotEnoughReplicas,
            C::GaplessGuarantee,
            C::OutOfOrderSequenceNumber,
        ] {
            assert_eq!(
                classify_code("t", code).kind,
                SinkErrorKind::Unavailable,
                "{code:?}"
            );
        }
        for code in [C::MessageSizeTooLarge, C::InvalidTopic, C::InvalidRecord] {
            assert_eq!(
                classify_code("t", code).kind,
                SinkErrorKind::Invalid,
                "{code:?}"
            );
        }
    }

    #[test]
    fn the_catch_all_is_a_rejection_not_an_outage() {
        for code in [C::PolicyViolation, C::InvalidRequiredAcks, C::Fail] {
            assert_eq!(
                classify_code("t", code).kind,
                SinkErrorKind::Rejected,
                "{code:?}"
            );
        }
        let other = classify("t", &KafkaError::Canceled);
        assert_eq!(other.kind, SinkErrorKind::Rejected);
    }
}
