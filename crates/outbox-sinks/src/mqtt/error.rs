//! What an MQTT failure says: the broker is unavailable, or it refused this message.

use outbox_core::{SinkError, SinkErrorKind};
use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode, PubAckReason};
use rumqttc::v5::ConnectionError;

/// The result a PUBACK with `reason` gives the message published to `topic`.
///
/// `Success` and `NoMatchingSubscribers` are acknowledgements: the broker took the message (with
/// no subscriber it has no one to give it to, as MQTT defines). `QuotaExceeded` is the broker's
/// "not now": unavailable. `NotAuthorized` and the unspecified and implementation-specific
/// errors are rejections; a topic or payload the broker calls invalid is an invalid message.
pub(crate) fn puback(topic: &str, reason: &PubAckReason) -> Result<(), SinkError> {
    let kind = match reason {
        PubAckReason::Success | PubAckReason::NoMatchingSubscribers => return Ok(()),
        PubAckReason::QuotaExceeded => SinkErrorKind::Unavailable,
        PubAckReason::TopicNameInvalid | PubAckReason::PayloadFormatInvalid => {
            SinkErrorKind::Invalid
        }
        _ => SinkErrorKind::Rejected,
    };
    let advice = match reason {
        PubAckReason::NotAuthorized => "; allow the relay's user to publish to it (broker ACL)",
        _ => "",
    };
    Err(SinkError::new(
        kind,
        format!("mqtt: the broker refused the message for topic `{topic}`: {reason:?}{advice}"),
    ))
}

/// The error every message in flight gets when the connection fails with `err`.
///
/// Everything at the connection level is an outage, refused credentials included
/// (`BadUserNamePassword`, `NotAuthorized`, `Banned`): a password rotated on the broker before
/// the relay's is the connection's fault, not the messages', and the relay keeps them pending
/// (the circuit opens) until an operator mends it, rather than failing each after its attempts.
/// The error names the broker and the cause. A client id the broker refuses stays a rejection.
pub(crate) fn connection(display: &str, err: &ConnectionError) -> SinkError {
    let kind = match err {
        ConnectionError::ConnectionRefused(
            ConnectReturnCode::ClientIdentifierNotValid | ConnectReturnCode::BadClientId,
        ) => SinkErrorKind::Rejected,
        _ => SinkErrorKind::Unavailable,
    };
    SinkError::new(kind, format!("mqtt: connection to {display}: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pubacks_map_to_kinds() {
        assert!(puback("a/b", &PubAckReason::Success).is_ok());
        assert!(puback("a/b", &PubAckReason::NoMatchingSubscribers).is_ok());
        let e = puback("a/b", &PubAckReason::NotAuthorized).unwrap_err();
        assert_eq!(e.kind, SinkErrorKind::Rejected);
        assert!(e.message.contains("`a/b`") && e.message.contains("NotAuthorized"));
        assert_eq!(
            puback("a", &PubAckReason::QuotaExceeded).unwrap_err().kind,
            SinkErrorKind::Unavailable
        );
        assert_eq!(
            puback("a", &PubAckReason::TopicNameInvalid)
                .unwrap_err()
                .kind,
            SinkErrorKind::Invalid
        );
        assert_eq!(
            puback("a", &PubAckReason::UnspecifiedError)
                .unwrap_err()
                .kind,
            SinkErrorKind::Rejected
        );
    }

    #[test]
    fn refused_credentials_and_lost_connections_are_outages() {
        let refused = ConnectionError::ConnectionRefused(ConnectReturnCode::BadUserNamePassword);
        assert_eq!(
            connection("mqtt://h", &refused).kind,
            SinkErrorKind::Unavailable
        );
        let bad_id = ConnectionError::ConnectionRefused(ConnectReturnCode::BadClientId);
        assert_eq!(
            connection("mqtt://h", &bad_id).kind,
            SinkErrorKind::Rejected
        );
        let busy = ConnectionError::ConnectionRefused(ConnectReturnCode::ServerBusy);
        assert_eq!(
            connection("mqtt://h", &busy).kind,
            SinkErrorKind::Unavailable
        );
        let io = ConnectionError::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(connection("mqtt://h", &io).kind, SinkErrorKind::Unavailable);
    }
}
