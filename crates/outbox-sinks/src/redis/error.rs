//! What a Redis failure says: the server is unavailable, or it refused this message.

use outbox_core::{SinkError, SinkErrorKind};
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// Maps a failure of the pipeline, or one command's error reply, for stream `stream` on the
/// server `server` (its URL with credentials masked) to a [`SinkError`].
///
/// [`SinkErrorKind::Unavailable`] only when the server did not answer or answered "not now":
/// connection refused or dropped, timeout, `LOADING` (reading its data after a restart),
/// `BUSY`, `TRYAGAIN`, `MASTERDOWN`, `CLUSTERDOWN`, `READONLY` (a replica, during a failover),
/// and `OOM` (`maxmemory` reached with no eviction: every write fails until memory is freed);
/// and a login the server refused (`WRONGPASS`, `NOAUTH`: a password rotated on the server
/// before the relay's) and a TLS handshake that failed (a wrong CA, an expired certificate):
/// the connection's, not the message's, so the relay keeps every message pending until an
/// operator mends it.
/// `WRONGTYPE` (the key holds something else than a stream), `NOPERM` (an ACL), refused
/// credentials and anything unrecognised are [`SinkErrorKind::Rejected`]. A payload over the
/// server's bulk length limit is [`SinkErrorKind::Invalid`].
pub(crate) fn classify(server: &str, stream: &str, err: &RedisError) -> SinkError {
    let text = outbox_core::redact::sanitize(&err.to_string());
    let kind = match err.kind() {
        ErrorKind::AuthenticationFailed => SinkErrorKind::Unavailable,
        _ if matches!(err.code(), Some("WRONGPASS" | "NOAUTH")) => SinkErrorKind::Unavailable,
        _ if err.is_timeout()
            || err.is_io_error()
            || err.is_connection_dropped()
            || err.is_connection_refusal() =>
        {
            SinkErrorKind::Unavailable
        }
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::ReadOnly,
        ) => SinkErrorKind::Unavailable,
        _ => match err.code() {
            Some("OOM" | "BUSY") => SinkErrorKind::Unavailable,
            _ if text.contains("max bulk length")
                || text.contains("exceeds maximum allowed size") =>
            {
                SinkErrorKind::Invalid
            }
            _ => SinkErrorKind::Rejected,
        },
    };
    let refused_login = matches!(err.kind(), ErrorKind::AuthenticationFailed)
        || matches!(err.code(), Some("WRONGPASS" | "NOAUTH"));
    let advice = match err.code() {
        _ if refused_login => {
            "; the server refused the relay's login: check the user and password_file"
        }
        Some("WRONGTYPE") => "; the key holds another type than a stream: rename the destination",
        Some("NOPERM") => "; grant the relay's ACL user XADD on the key",
        _ => "",
    };
    SinkError::new(
        kind,
        format!("redis {server}: XADD to stream `{stream}`: {text}{advice}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: &str, detail: &str) -> RedisError {
        redis::make_extension_error(code.to_string(), Some(detail.to_string()))
    }

    #[test]
    fn wrong_type_and_acl_refusals_are_rejections_naming_the_stream() {
        let e = classify(
            "redis://h",
            "orders",
            &server(
                "WRONGTYPE",
                "Operation against a key holding the wrong kind of value",
            ),
        );
        assert_eq!(e.kind, SinkErrorKind::Rejected);
        assert!(e.message.contains("`orders`") && e.message.contains("another type"));
        let e = classify(
            "redis://h",
            "orders",
            &server("NOPERM", "this user has no permissions"),
        );
        assert_eq!(e.kind, SinkErrorKind::Rejected);
        assert_eq!(
            classify("redis://h", "s", &server("WHATEVER", "?")).kind,
            SinkErrorKind::Rejected
        );
    }

    #[test]
    fn no_answer_and_try_later_are_outages() {
        let io: RedisError = std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
        assert_eq!(
            classify("redis://h", "s", &io).kind,
            SinkErrorKind::Unavailable
        );
        assert_eq!(
            classify(
                "redis://h",
                "s",
                &server("OOM", "command not allowed when used memory > 'maxmemory'")
            )
            .kind,
            SinkErrorKind::Unavailable
        );
        let e = classify(
            "redis://h",
            "s",
            &server("WRONGPASS", "invalid username-password pair"),
        );
        assert_eq!(e.kind, SinkErrorKind::Unavailable);
        assert!(e.message.contains("redis redis://h:"), "{}", e.message);
    }
}
