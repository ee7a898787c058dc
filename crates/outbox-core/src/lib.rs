//! Core of the outbox toolkit: the message model, the `Store` and `Sink` traits every backend and
//! broker implements, errors with kinds, the retry policy and destination routing.
//!
//! Nothing here talks to a database or a broker; backends (`outbox-postgres`, …) and sinks
//! (`outbox-sinks`) implement the traits, and `outbox-relay` drives them.

pub mod cloudevents;
pub mod debezium;
pub mod error;
pub mod flow;
pub mod format;
pub mod gauges;
pub mod grants;
pub mod identifier;
pub mod journey;
pub mod message;
pub mod options;
pub mod redact;
pub mod retry;
pub mod route;
pub mod routing;
pub mod secret;
pub mod sink;
pub mod status;
pub mod store;
pub mod text;
pub mod tls;
pub mod trace;

pub use bytes::Bytes;
pub use error::{Error, ErrorKind, Result};
pub use format::{Format, Formatted};
pub use gauges::{Gauges, PinAge, SequencerGauges, SlotGauges};
pub use grants::{Grant, Part};
pub use journey::{Journey, JourneyQuery, JourneyState, JourneyStep};
pub use message::{Message, NewMessage};
pub use retry::{Backoff, RetryPolicy};
pub use route::{Glob, RouteMatch, RouteSpec};
pub use routing::{DestinationPattern, DestinationRules, DestinationTemplate};
pub use secret::Secret;
pub use sink::{Envelope, Sink, SinkError, SinkErrorKind};
pub use store::{
    BlockedKey, ClaimLimits, FailedFilter, FailedMessage, FailedPage, Maintenance, MemberId,
    OnFailed, Outcome, RedriveScope, Stats, Store,
};
