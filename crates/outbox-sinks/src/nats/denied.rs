//! Subjects the server recently refused to let this connection publish to.
//!
//! NATS does not answer a publish it denies: it sends an asynchronous
//! `-ERR 'Permissions Violation for Publish to "subject"'` and drops the message, so the
//! JetStream acknowledgement can only time out. Remembering the refusal lets that timeout be
//! classified as what it is, a rejection of the message, rather than the broker being
//! unavailable (which would open the circuit, and let every probe land on the denied message
//! without spending its attempts).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a refusal is remembered: far longer than any ack timeout, so the timeout of the
/// publish it answered always finds it.
const REMEMBER: Duration = Duration::from_secs(60);
/// Subjects remembered at most: a flood of distinct denied subjects cannot grow memory.
const MAX_SUBJECTS: usize = 10_000;

/// Shared between the connection's event callback (which notes refusals) and the sink (which
/// asks about a subject whose acknowledgement timed out).
#[derive(Clone, Default)]
pub(crate) struct Denied(Arc<Mutex<HashMap<String, Instant>>>);

impl Denied {
    /// Notes the subject of a server error if it is a publish permissions violation.
    pub(crate) fn note(&self, server_error: &str) {
        let Some(subject) = denied_subject(server_error) else {
            return;
        };
        let Ok(mut map) = self.0.lock() else { return };
        let now = Instant::now();
        if map.len() >= MAX_SUBJECTS {
            map.retain(|_, at| now.duration_since(*at) < REMEMBER);
            if map.len() >= MAX_SUBJECTS {
                map.clear();
            }
        }
        map.insert(subject.to_string(), now);
    }

    /// Whether the server refused a publish to `subject` within the last minute.
    pub(crate) fn recently(&self, subject: &str) -> bool {
        self.0
            .lock()
            .ok()
            .and_then(|map| map.get(subject).map(|at| at.elapsed() < REMEMBER))
            .unwrap_or(false)
    }
}

/// `subject` from `Permissions Violation for Publish to "subject"` (the server's text, quotes
/// optional), or `None` for any other error.
fn denied_subject(server_error: &str) -> Option<&str> {
    let rest = server_error
        .trim()
        .strip_prefix("Permissions Violation for Publish to ")?;
    let subject = rest.trim().trim_matches('"');
    (!subject.is_empty()).then_some(subject)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_violations_are_remembered_by_subject() {
        let d = Denied::default();
        d.note("Permissions Violation for Publish to \"orders.secret\"");
        d.note("Permissions Violation for Subscription to \"_INBOX.x\"");
        d.note("Maximum Payload Violation");
        assert!(d.recently("orders.secret"));
        assert!(!d.recently("orders.public"));
        assert!(!d.recently("_INBOX.x"), "only publish violations");
    }

    #[test]
    fn the_subject_is_read_with_or_without_quotes() {
        assert_eq!(
            denied_subject("Permissions Violation for Publish to a.b"),
            Some("a.b")
        );
        assert_eq!(
            denied_subject("Permissions Violation for Publish to \"a.b\""),
            Some("a.b")
        );
        assert_eq!(
            denied_subject("Permissions Violation for Publish to "),
            None
        );
    }
}
