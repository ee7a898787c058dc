//! What a webhook's answer means for the message: `unavailable` (retried, feeds the breaker),
//! `rejected` (retried within the budget, then `failed`) or `invalid` (`failed` at once).

use std::time::Duration;

use outbox_core::SinkError;
use reqwest::StatusCode;

/// Most of a response body kept in an error: enough for a validation message.
const BODY_IN_ERROR: usize = 300;

/// No response: connection refused or lost, a timeout, a TLS failure.
pub(crate) fn transport_error(url: &str, e: &reqwest::Error) -> SinkError {
    let what = if e.is_timeout() {
        "no response in time"
    } else if e.is_connect() {
        "cannot connect"
    } else {
        "request failed"
    };
    // reqwest's message names the URL; the sanitiser masks credentials in it.
    SinkError::unavailable(format!("http: POST {url}: {what}: {e}"))
}

/// A response other than 2xx.
pub(crate) fn response_error(
    url: &str,
    status: StatusCode,
    retry_after: Option<Duration>,
    location: Option<&str>,
    body: &[u8],
) -> SinkError {
    let snippet: String = String::from_utf8_lossy(body)
        .chars()
        .take(BODY_IN_ERROR)
        .collect();
    let said = if snippet.trim().is_empty() {
        String::new()
    } else {
        format!(": {}", snippet.trim())
    };
    let code = status.as_u16();
    let text = format!("http: POST {url}: {status}{said}");
    match code {
        408 | 429 | 500..=599 => {
            let e = SinkError::unavailable(text);
            match retry_after {
                Some(wait) => e.with_retry_after(wait),
                None => e,
            }
        }
        413 => SinkError::invalid(text),
        300..=399 => SinkError::rejected(format!(
            "http: POST {url}: {status}, redirected to {}: redirects are not followed; give the \
             final URL",
            outbox_core::redact::url(location.unwrap_or("(no Location)"))
        )),
        _ => SinkError::rejected(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::SinkErrorKind;

    #[test]
    fn statuses_map_to_kinds() {
        let kind = |code: u16| {
            response_error(
                "http://h/x",
                StatusCode::from_u16(code).unwrap_or(StatusCode::IM_A_TEAPOT),
                None,
                None,
                b"",
            )
            .kind
        };
        for code in [408, 429, 500, 502, 503, 504] {
            assert_eq!(kind(code), SinkErrorKind::Unavailable, "{code}");
        }
        assert_eq!(kind(413), SinkErrorKind::Invalid);
        for code in [301, 400, 401, 403, 404, 409, 422] {
            assert_eq!(kind(code), SinkErrorKind::Rejected, "{code}");
        }
        let e = response_error(
            "http://h/x",
            StatusCode::SERVICE_UNAVAILABLE,
            Some(Duration::from_secs(3)),
            None,
            b"maintenance",
        );
        assert_eq!(e.retry_after, Some(Duration::from_secs(3)));
        assert!(
            e.message.contains("503") && e.message.contains("maintenance"),
            "{}",
            e.message
        );
        let e = response_error(
            "http://h/x",
            StatusCode::UNPROCESSABLE_ENTITY,
            None,
            None,
            b"amount: must be positive",
        );
        assert!(
            e.message.contains("amount: must be positive"),
            "{}",
            e.message
        );
    }
}
