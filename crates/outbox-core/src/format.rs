//! Envelope formats a route publishes in (`envelope=` of `--route`): the relay's own (the
//! default: the payload and the `outbox-*` headers), CloudEvents 1.0 in binary or structured
//! mode, Debezium's Outbox Event Router. [`Formatted`] wraps a sink and lays each envelope out in the route's format just
//! before it publishes, so every sink gets it the same way and no sink knows about formats
//! beyond moving `content-type` to its protocol's own property.

use async_trait::async_trait;

use crate::cloudevents::{Binding, CloudEvents, Mode, DEFAULT_SOURCE};
use crate::sink::{Envelope, Sink, SinkError};

/// How a route lays out what it publishes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Format {
    /// The payload byte for byte and the `outbox-*` headers (docs/sinks.md).
    #[default]
    Outbox,
    /// CloudEvents 1.0 (docs/envelopes.md).
    CloudEvents(CloudEvents),
    /// What Debezium's Outbox Event Router produces (docs/migrating-from-debezium.md).
    Debezium(crate::debezium::Debezium),
}

/// The `envelope=` values a route takes.
pub const FORMAT_NAMES: &str = "outbox, cloudevents, cloudevents-structured, debezium";

impl Format {
    /// The format named `name` (`outbox`, `cloudevents`, `cloudevents-structured`), with the
    /// CloudEvents `source` of the route (default [`DEFAULT_SOURCE`]); a `source` with the
    /// `outbox` format is refused rather than ignored.
    pub fn parse(name: &str, source: Option<&str>) -> Result<Self, String> {
        let mode = match name {
            "outbox" => {
                return match source {
                    None => Ok(Self::Outbox),
                    Some(_) => Err("`source` is a CloudEvents attribute; it needs \
                                    envelope=cloudevents or envelope=cloudevents-structured"
                        .into()),
                }
            }
            "cloudevents" | "cloudevents-binary" => Mode::Binary,
            "cloudevents-structured" => Mode::Structured,
            "debezium" => {
                return match source {
                    None => Ok(Self::Debezium(crate::debezium::Debezium::from_options([])?)),
                    Some(_) => Err("`source` is a CloudEvents attribute; envelope=debezium \
                                    takes the Event Router's options"
                        .into()),
                }
            }
            other => {
                return Err(format!(
                    "unknown envelope `{}`; use {FORMAT_NAMES}",
                    crate::redact::sanitize(other)
                ))
            }
        };
        CloudEvents::new(mode, source.unwrap_or(DEFAULT_SOURCE)).map(Self::CloudEvents)
    }

    /// The name `--route` takes.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Outbox => "outbox",
            Self::CloudEvents(c) if c.mode == Mode::Binary => "cloudevents",
            Self::CloudEvents(_) => "cloudevents-structured",
            Self::Debezium(_) => "debezium",
        }
    }

    /// Whether the envelope is published as the relay built it.
    pub fn is_outbox(&self) -> bool {
        matches!(self, Self::Outbox)
    }

    /// `e` laid out in this format for a sink of `binding`, or why the row cannot be.
    pub fn apply(&self, binding: Binding, e: &Envelope) -> Result<Envelope, String> {
        match self {
            Self::Outbox => Ok(e.clone()),
            Self::CloudEvents(c) => c.apply(binding, e),
            Self::Debezium(d) => d.apply(e),
        }
    }
}

/// A sink that publishes in a [`Format`]: each envelope is laid out, then handed to the inner
/// sink. An envelope the format refuses fails alone as [`SinkError::invalid`] (the row ends
/// `failed` with the reason); the others of the call are published.
pub struct Formatted<S> {
    inner: S,
    format: Format,
    binding: Binding,
}

impl<S: Sink> Formatted<S> {
    /// `inner`, publishing in `format` by the binding its name says.
    pub fn new(inner: S, format: Format) -> Self {
        let binding = Binding::for_sink(inner.name());
        Self {
            inner,
            format,
            binding,
        }
    }
}

#[async_trait]
impl<S: Sink> Sink for Formatted<S> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn ack_timeout(&self) -> Option<std::time::Duration> {
        self.inner.ack_timeout()
    }
    fn orders_keys(&self) -> bool {
        self.inner.orders_keys()
    }
    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        let mut laid = Vec::with_capacity(batch.len());
        let mut refused: Vec<Option<SinkError>> = Vec::with_capacity(batch.len());
        for e in batch {
            match self.format.apply(self.binding, e) {
                Ok(out) => {
                    laid.push(out);
                    refused.push(None);
                }
                Err(why) => refused.push(Some(SinkError::invalid(format!(
                    "{} envelope: {why}",
                    self.format.name()
                )))),
            }
        }
        let mut published = self.inner.publish(&laid).await.into_iter();
        refused
            .into_iter()
            .map(|r| match r {
                Some(err) => Err(err),
                None => published.next().unwrap_or_else(|| {
                    Err(SinkError::unavailable(
                        "the sink returned fewer results than it was given messages",
                    ))
                }),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn names_parse_and_a_stray_source_is_refused() {
        assert_eq!(Format::parse("outbox", None).unwrap(), Format::Outbox);
        let Format::CloudEvents(c) = Format::parse("cloudevents", None).unwrap() else {
            panic!("cloudevents")
        };
        assert_eq!((c.mode, c.source()), (Mode::Binary, DEFAULT_SOURCE));
        let s = Format::parse("cloudevents-structured", Some("urn:x")).unwrap();
        assert_eq!(s.name(), "cloudevents-structured");
        assert!(Format::parse("outbox", Some("/x"))
            .unwrap_err()
            .contains("needs envelope=cloudevents"));
        assert!(Format::parse("avro", None)
            .unwrap_err()
            .contains("unknown envelope"));
        assert!(Format::parse("cloudevents", Some("a b"))
            .unwrap_err()
            .contains("not a URI-reference"));
    }

    /// Records what it is given and acknowledges it.
    struct Recorder(Mutex<Vec<Envelope>>);

    #[async_trait]
    impl Sink for Recorder {
        fn name(&self) -> &str {
            "kafka"
        }
        async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
            self.0.lock().unwrap().extend(batch.iter().cloned());
            batch.iter().map(|_| Ok(())).collect()
        }
    }

    fn envelope(headers: &[(&str, &str)]) -> Envelope {
        Envelope {
            id: uuid::Uuid::now_v7(),
            destination: "d".into(),
            key: "k".into(),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            payload: bytes::Bytes::from_static(b"{}"),
            created_at: chrono::Utc::now(),
        }
    }

    #[tokio::test]
    async fn a_refused_envelope_fails_alone_and_the_rest_are_published_in_order() {
        let sink = Formatted::new(
            Recorder(Mutex::new(Vec::new())),
            Format::parse("cloudevents", None).unwrap(),
        );
        let t = (crate::sink::HEADER_EVENT_TYPE, "t");
        let batch = [
            envelope(&[t]),
            envelope(&[t, ("ce_id", "x")]),
            envelope(&[t]),
        ];
        let results = sink.publish(&batch).await;
        assert!(results[0].is_ok() && results[2].is_ok());
        let err = results[1].as_ref().unwrap_err();
        assert_eq!(err.kind, crate::SinkErrorKind::Invalid);
        assert!(err.message.contains("ce_id"), "{err}");
        let seen = sink.inner.0.lock().unwrap();
        assert_eq!(
            seen.iter().map(|e| e.id).collect::<Vec<_>>(),
            vec![batch[0].id, batch[2].id]
        );
        assert!(seen[0].headers.iter().any(|(k, _)| k == "ce_specversion"));
    }
}
