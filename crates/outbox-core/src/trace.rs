//! W3C trace context in a message's headers: the writer records the `traceparent` (and
//! `tracestate`) current when the row is written, every sink forwards them as the broker's
//! header or attribute, and the relay and the inbox link or continue the writer's trace.
//!
//! A row written by any language carries it the same way: the header names below, in the row's
//! `headers` object (see `docs/sql-contract.md`). With the `otel` feature, [`current`] reads
//! the current OpenTelemetry span and [`span_context`] turns a message's headers back into the
//! span context to link to or continue.

use std::fmt;

/// The header that carries the W3C `traceparent`.
pub const HEADER_TRACEPARENT: &str = "traceparent";
/// The header that carries the W3C `tracestate`.
pub const HEADER_TRACESTATE: &str = "tracestate";

/// A parsed W3C `traceparent` (version 00): `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// Trace id (never all zero).
    pub trace_id: [u8; 16],
    /// The writer's span id (never all zero).
    pub span_id: [u8; 8],
    /// Trace flags; bit 0 is "sampled".
    pub flags: u8,
}

impl TraceParent {
    /// Parses `s`, or says what is wrong with it. Lowercase hex only, as the specification
    /// requires; a later version's extra fields are accepted and ignored.
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = |why: &str| Err(format!("traceparent `{s}`: {why}"));
        let mut parts = s.trim().split('-');
        let (Some(version), Some(trace), Some(span), Some(flags)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return bad("expected version-traceid-spanid-flags");
        };
        if version.len() != 2 || version == "ff" || !lower_hex(version) {
            return bad("the version must be two lowercase hex digits, not ff");
        }
        if version == "00" && parts.next().is_some() {
            return bad("version 00 has exactly four fields");
        }
        let (Some(trace_id), Some(span_id), Some(flags)) = (
            hex::<16>(trace),
            hex::<8>(span),
            hex::<1>(flags).map(|f| f[0]),
        ) else {
            return bad("expected 32, 16 and 2 lowercase hex digits");
        };
        if trace_id == [0; 16] || span_id == [0; 8] {
            return bad("an all-zero trace or span id is invalid");
        }
        Ok(Self {
            trace_id,
            span_id,
            flags,
        })
    }

    /// Whether the writer's span was sampled.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("00-")?;
        for b in self.trace_id {
            write!(f, "{b:02x}")?;
        }
        f.write_str("-")?;
        for b in self.span_id {
            write!(f, "{b:02x}")?;
        }
        write!(f, "-{:02x}", self.flags)
    }
}

fn lower_hex(s: &str) -> bool {
    s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !lower_hex(s) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// The trace context in `headers` (name, value pairs; names matched without case), if its
/// `traceparent` is valid: the parent and the `tracestate` beside it.
pub fn from_headers<'h>(
    headers: impl IntoIterator<Item = (&'h str, &'h str)>,
) -> Option<(TraceParent, Option<&'h str>)> {
    let (mut parent, mut state) = (None, None);
    for (k, v) in headers {
        if k.eq_ignore_ascii_case(HEADER_TRACEPARENT) {
            parent = TraceParent::parse(v).ok();
        } else if k.eq_ignore_ascii_case(HEADER_TRACESTATE) {
            state = Some(v);
        }
    }
    parent.map(|p| (p, state))
}

/// The OpenTelemetry span context of a message whose headers carry a valid `traceparent`: the
/// writer's span, remote, to link to (the relay, a batch) or to continue (a handler).
#[cfg(feature = "otel")]
pub fn span_context<'h>(
    headers: impl IntoIterator<Item = (&'h str, &'h str)>,
) -> Option<opentelemetry::trace::SpanContext> {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    let (p, state) = from_headers(headers)?;
    let state = state
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    Some(SpanContext::new(
        TraceId::from_bytes(p.trace_id),
        SpanId::from_bytes(p.span_id),
        TraceFlags::new(p.flags),
        true,
        state,
    ))
}

/// The `traceparent` and `tracestate` of the current OpenTelemetry span, or `None` outside a
/// valid span.
#[cfg(feature = "otel")]
pub fn current() -> Option<(TraceParent, Option<String>)> {
    use opentelemetry::trace::TraceContextExt as _;
    let cx = opentelemetry::Context::current();
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return None;
    }
    let state = sc.trace_state().header();
    Some((
        TraceParent {
            trace_id: sc.trace_id().to_bytes(),
            span_id: sc.span_id().to_bytes(),
            flags: sc.trace_flags().to_u8(),
        },
        (!state.is_empty()).then_some(state),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_round_trips() {
        let p = TraceParent::parse(GOOD).unwrap_or_else(|e| panic!("{e}"));
        assert!(p.sampled());
        assert_eq!(p.to_string(), GOOD);
    }

    #[test]
    fn malformed_traceparents_are_refused_with_the_reason() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
        ] {
            let e = TraceParent::parse(bad).err();
            assert!(e.is_some_and(|e| e.starts_with("traceparent")), "{bad}");
        }
        assert!(TraceParent::parse(&format!("01-{}-extra", &GOOD[3..])).is_ok());
    }

    #[test]
    fn headers_give_the_parent_and_its_state_whatever_the_case() {
        let h = [
            ("TraceParent", GOOD),
            ("tracestate", "vendor=1"),
            ("x", "y"),
        ];
        let (p, s) = from_headers(h).unwrap_or_else(|| panic!("no context"));
        assert_eq!(p.to_string(), GOOD);
        assert_eq!(s, Some("vendor=1"));
        assert!(from_headers([("traceparent", "junk")]).is_none());
    }
}
