//! OpenTelemetry spans of the receiving side (feature `otel`; on at run time once [`enable`] is
//! called, for `outbox inbox --otlp-endpoint` or an application that traces its processor):
//!
//! - the ingest daemon's **receive** span per batch, linked to each message's writer span;
//! - the processor's **process** span per message, a child of the writer's span (the
//!   `traceparent` the message carries), current while the handler runs, so the handler's own
//!   spans join the writer's trace: one trace from the writer's transaction to the handler.
//!
//! Without the feature, or before [`enable`], nothing here reads a header.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::message::InboxMessage;

static ON: AtomicBool = AtomicBool::new(false);

/// Turns the inbox's spans on, through the process's global OpenTelemetry tracer provider (set
/// it first). Without the `otel` feature it does nothing.
pub fn enable() {
    ON.store(cfg!(feature = "otel"), Ordering::Relaxed);
}

#[cfg(feature = "otel")]
fn context_of(m: &InboxMessage) -> Option<opentelemetry::trace::SpanContext> {
    outbox_core::trace::span_context(
        m.headers
            .iter()
            .filter_map(|(k, v)| v.as_str().map(|v| (k.as_str(), v))),
    )
}

/// The receive span of one fetched batch, ended once it is recorded.
pub(crate) struct ReceiveSpan {
    #[cfg(feature = "otel")]
    span: Option<opentelemetry::global::BoxedSpan>,
}

impl ReceiveSpan {
    /// Starts the span of recording `messages` fetched from `source`.
    pub(crate) fn start(source: &str, messages: &[InboxMessage]) -> Self {
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
            let links: Vec<Link> = messages
                .iter()
                .filter_map(context_of)
                .map(Link::with_context)
                .collect();
            let tracer = opentelemetry::global::tracer("outbox-inbox");
            let span = tracer
                .span_builder(format!("receive {source}"))
                .with_kind(SpanKind::Consumer)
                .with_links(links)
                .with_attributes([
                    KeyValue::new("messaging.operation.type", "receive"),
                    KeyValue::new("messaging.batch.message_count", messages.len() as i64),
                    KeyValue::new("outbox.source", source.to_string()),
                ])
                .start(&tracer);
            Self { span: Some(span) }
        }
        #[cfg(not(feature = "otel"))]
        {
            let _ = (source, messages);
            Self {}
        }
    }

    /// Ends the span with how many were recorded for the first time and how many were
    /// duplicates, or the error that kept the batch from being recorded.
    pub(crate) fn end(self, outcome: Result<(u64, u64), &str>) {
        #[cfg(feature = "otel")]
        if let Some(mut span) = self.span {
            use opentelemetry::trace::{Span as _, Status};
            use opentelemetry::KeyValue;
            match outcome {
                Ok((recorded, duplicates)) => {
                    span.set_attribute(KeyValue::new("outbox.recorded", recorded as i64));
                    span.set_attribute(KeyValue::new("outbox.duplicates", duplicates as i64));
                }
                Err(e) => span.set_status(Status::error(e.to_string())),
            }
            span.end();
        }
        #[cfg(not(feature = "otel"))]
        let _ = outcome;
    }
}

/// Runs `handle` (a handler applying `m`) inside the message's process span: a child of the
/// writer's span when `m` carries its `traceparent`, current while the handler runs.
pub(crate) async fn process<T, E: std::fmt::Display>(
    m: &InboxMessage,
    handle: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, E> {
    if !ON.load(Ordering::Relaxed) {
        return handle.await;
    }
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::{
            FutureExt as _, SpanKind, Status, TraceContextExt as _, Tracer as _,
        };
        use opentelemetry::{Context, KeyValue};
        let parent = match context_of(m) {
            Some(sc) => Context::new().with_remote_span_context(sc),
            None => Context::new(),
        };
        let tracer = opentelemetry::global::tracer("outbox-inbox");
        let span = tracer
            .span_builder(format!("process {}", m.message_type))
            .with_kind(SpanKind::Consumer)
            .with_attributes([
                KeyValue::new("messaging.operation.type", "process"),
                KeyValue::new("messaging.message.id", m.id.to_string()),
                KeyValue::new("outbox.key", m.key.clone()),
            ])
            .start_with_context(&tracer, &parent);
        let cx = parent.with_span(span);
        let result = handle.with_context(cx.clone()).await;
        if let Err(e) = &result {
            cx.span().set_status(Status::error(e.to_string()));
        }
        cx.span().end();
        result
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = m;
        handle.await
    }
}
