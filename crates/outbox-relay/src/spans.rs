//! OpenTelemetry publish spans (feature `otel`; on at run time once [`enable`] is called, for
//! `outbox relay --otlp-endpoint`): one span per publish call, a batch of messages sent to one
//! sink, **linked** to each message's writer span (the `traceparent` its row carries), not
//! parented by it, as messaging conventions and River do: a batch serves many traces, and the
//! writer's trace should not grow a child for every relay that ever retried it.
//!
//! Without the feature, or before [`enable`], every call here is a no-op: no header is read.

use std::sync::atomic::{AtomicBool, Ordering};

use outbox_core::{Envelope, SinkError};

static ON: AtomicBool = AtomicBool::new(false);

/// Turns publish spans on, through the process's global OpenTelemetry tracer provider (set it
/// first). Without the `otel` feature it does nothing.
pub fn enable() {
    ON.store(cfg!(feature = "otel"), Ordering::Relaxed);
}

/// The span of one publish call, ended with its results.
pub(crate) struct PublishSpan {
    #[cfg(feature = "otel")]
    span: Option<opentelemetry::global::BoxedSpan>,
}

impl PublishSpan {
    /// Starts the span of sending `envelopes` to `sink` for `route`.
    pub(crate) fn start(sink: &str, route: &str, envelopes: &[Envelope]) -> Self {
        if !ON.load(Ordering::Relaxed) {
            return Self {
                #[cfg(feature = "otel")]
                span: None,
            };
        }
        #[cfg(feature = "otel")]
        {
            use opentelemetry::trace::{Link, SpanKind, Tracer as _};
            use opentelemetry::KeyValue;
            let links: Vec<Link> = envelopes
                .iter()
                .filter_map(|e| {
                    outbox_core::trace::span_context(
                        e.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                    )
                })
                .map(Link::with_context)
                .collect();
            let tracer = opentelemetry::global::tracer("outbox-relay");
            let span = tracer
                .span_builder(format!("publish {route}"))
                .with_kind(SpanKind::Producer)
                .with_links(links)
                .with_attributes([
                    KeyValue::new("messaging.system", sink.to_string()),
                    KeyValue::new("messaging.operation.type", "send"),
                    KeyValue::new("messaging.operation.name", "publish"),
                    KeyValue::new("messaging.batch.message_count", envelopes.len() as i64),
                    KeyValue::new("outbox.route", route.to_string()),
                ])
                .start(&tracer);
            Self { span: Some(span) }
        }
        #[cfg(not(feature = "otel"))]
        {
            let _ = (sink, route, envelopes);
            Self {}
        }
    }

    /// Ends the span: an error status with the first error when any message was not taken.
    pub(crate) fn end(self, results: &[Result<(), SinkError>]) {
        #[cfg(feature = "otel")]
        if let Some(mut span) = self.span {
            use opentelemetry::trace::{Span as _, Status};
            use opentelemetry::KeyValue;
            let failed: Vec<&SinkError> = results.iter().filter_map(|r| r.as_ref().err()).collect();
            span.set_attribute(KeyValue::new("outbox.failed_count", failed.len() as i64));
            if let Some(e) = failed.first() {
                span.set_status(Status::error(format!("{}: {}", e.kind, e.message)));
            }
            span.end();
        }
        #[cfg(not(feature = "otel"))]
        let _ = results;
    }
}
