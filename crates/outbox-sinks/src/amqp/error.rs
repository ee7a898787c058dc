//! What a RabbitMQ failure says: the broker is unavailable, or it refused this message.

use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::ErrorKind;
use outbox_core::{SinkError, SinkErrorKind};

/// Where a message was going, for error texts: `exchange `x` routing key `rk``, or `queue `q``
/// on the default exchange.
pub(crate) fn target(exchange: &str, routing_key: &str) -> String {
    if exchange.is_empty() {
        format!("the default exchange (queue `{routing_key}`)")
    } else {
        format!("exchange `{exchange}` routing key `{routing_key}`")
    }
}

/// Maps a client error met while connecting, opening a channel, publishing to `target` or
/// awaiting its confirm to a [`SinkError`].
///
/// [`SinkErrorKind::Unavailable`] (feeds the circuit breaker) only when the broker did not
/// answer: connection refused, reset or closed, a missed heartbeat, the broker forcing the
/// connection closed (shutdown, `rabbitmqctl close_connection`) or failing internally.
/// [`SinkErrorKind::Invalid`] for a message over the broker's size limit. Everything else the
/// broker answered is [`SinkErrorKind::Rejected`], the unrecognised included: no exchange of
/// that name (`NOT_FOUND`), `ACCESS_REFUSED`, a precondition, a channel the broker closed.
/// `connected` says whether the connection was still up when the error was seen: a channel
/// that failed under a dead connection is an outage, not a refusal.
pub(crate) fn classify(target: &str, err: &lapin::Error, connected: bool) -> SinkError {
    let broker = |kind: SinkErrorKind, what: &str| {
        SinkError::new(
            kind,
            format!("rabbitmq: {what} publishing to {target}: {err}"),
        )
    };
    match err.kind() {
        ErrorKind::ProtocolError(e) => {
            let text = e.get_message().as_str();
            match e.kind() {
                AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) => SinkError::rejected(format!(
                    "rabbitmq: the broker refused the message for {target}: {text}; declare \
                     the exchange, then redrive if the message ended failed"
                )),
                AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) => SinkError::rejected(format!(
                    "rabbitmq: access refused publishing to {target}: {text}; grant the relay's \
                     user write permission on the exchange"
                )),
                AMQPErrorKind::Soft(AMQPSoftError::CONTENTTOOLARGE) => SinkError::invalid(format!(
                    "rabbitmq: the message for {target} is larger than the broker accepts: {text}"
                )),
                AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED)
                    if text.contains("max size") || text.contains("message size") =>
                {
                    SinkError::invalid(format!(
                        "rabbitmq: the message for {target} is larger than the broker's \
                         max_message_size: {text}"
                    ))
                }
                AMQPErrorKind::Hard(
                    AMQPHardError::CONNECTIONFORCED
                    | AMQPHardError::INTERNALERROR
                    | AMQPHardError::RESOURCEERROR,
                ) => broker(
                    SinkErrorKind::Unavailable,
                    "connection closed by the broker",
                ),
                _ => SinkError::rejected(format!(
                    "rabbitmq: the broker refused the message for {target}: {} {text}",
                    e.get_id()
                )),
            }
        }
        ErrorKind::IOError(_)
        | ErrorKind::RuntimeShutdownError(_)
        | ErrorKind::MissingHeartbeatError
        | ErrorKind::InvalidConnectionState(_) => broker(SinkErrorKind::Unavailable, "no broker"),
        ErrorKind::InvalidChannelState(..) | ErrorKind::InvalidChannel(_) if !connected => {
            broker(SinkErrorKind::Unavailable, "connection lost")
        }
        // The channel closed under a live connection: the broker closed it for an error of
        // another message in flight on it (its own result names that error). Retried.
        ErrorKind::InvalidChannelState(..) | ErrorKind::InvalidChannel(_) => broker(
            SinkErrorKind::Rejected,
            "the broker closed the channel (for another message's error)",
        ),
        _ => broker(SinkErrorKind::Rejected, "failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::protocol::AMQPError;

    fn protocol(kind: AMQPErrorKind, text: &str) -> lapin::Error {
        ErrorKind::ProtocolError(AMQPError::new(kind, text.into())).into()
    }

    #[test]
    fn missing_exchange_and_access_refused_are_rejections_naming_the_target() {
        let t = target("orders", "order.placed");
        let e = classify(
            &t,
            &protocol(
                AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND),
                "NOT_FOUND - no exchange 'orders' in vhost '/'",
            ),
            true,
        );
        assert_eq!(e.kind, SinkErrorKind::Rejected);
        assert!(e
            .message
            .contains("exchange `orders` routing key `order.placed`"));
        assert!(e.message.contains("no exchange 'orders'"), "{}", e.message);
        let e = classify(
            &t,
            &protocol(
                AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED),
                "ACCESS_REFUSED - write access to exchange 'orders' refused",
            ),
            true,
        );
        assert_eq!(e.kind, SinkErrorKind::Rejected);
        assert!(e.message.contains("access refused"), "{}", e.message);
    }

    #[test]
    fn oversized_messages_are_invalid() {
        let e = classify(
            "q",
            &protocol(
                AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED),
                "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1024",
            ),
            true,
        );
        assert_eq!(e.kind, SinkErrorKind::Invalid);
        let other = classify(
            "q",
            &protocol(
                AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED),
                "PRECONDITION_FAILED - inequivalent arg 'durable'",
            ),
            true,
        );
        assert_eq!(other.kind, SinkErrorKind::Rejected);
    }

    #[test]
    fn lost_connections_are_outages_and_the_catch_all_is_a_rejection() {
        let io: lapin::Error = std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
        assert_eq!(classify("q", &io, false).kind, SinkErrorKind::Unavailable);
        let forced = protocol(
            AMQPErrorKind::Hard(AMQPHardError::CONNECTIONFORCED),
            "CONNECTION_FORCED - broker forced connection closure",
        );
        assert_eq!(
            classify("q", &forced, false).kind,
            SinkErrorKind::Unavailable
        );
        let closed: lapin::Error =
            ErrorKind::InvalidChannelState(lapin::ChannelState::Closed, "basic.publish").into();
        assert_eq!(
            classify("q", &closed, false).kind,
            SinkErrorKind::Unavailable
        );
        assert_eq!(classify("q", &closed, true).kind, SinkErrorKind::Rejected);
        let odd = protocol(AMQPErrorKind::Hard(AMQPHardError::NOTIMPLEMENTED), "?");
        assert_eq!(classify("q", &odd, true).kind, SinkErrorKind::Rejected);
        assert_eq!(
            classify("q", &ErrorKind::FutureCompleted.into(), true).kind,
            SinkErrorKind::Rejected
        );
    }
}
