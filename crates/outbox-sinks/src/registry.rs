//! What a sink tells the crate about itself: the one entry per broker that `connect`, `check`,
//! `ack_timeout`, `scratch` and the lists of schemes all read, so no function matches a URL
//! scheme of its own.
//!
//! Each sink folder defines `pub(crate) const KIND: SinkKind` in its `mod.rs`; [`crate::SINKS`]
//! lists them, one cfg-gated line per broker. Adding a sink adds a folder and that line.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use outbox_core::{Error, Sink};

use crate::read::{Scratch, ScratchOptions};

/// A sink being connected.
pub type Connecting<'a> = BoxFuture<'a, Result<Arc<dyn Sink>, Error>>;

/// A scratch destination being made.
pub type Making<'a> = BoxFuture<'a, Result<Scratch, Error>>;

/// Connects the sink a URL names (the URL was matched to the entry by its scheme).
pub type Connect = for<'a> fn(&'a str) -> Connecting<'a>;

/// Makes a scratch destination on the broker a URL names, and a reader of it.
pub type MakeScratch = for<'a> fn(&'a str, &'a ScratchOptions) -> Making<'a>;

/// Where a sink URL keeps its options, so a default can be added to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionsIn {
    /// In the query (`?ack_timeout=…`): every broker's URL.
    Query,
    /// In the fragment (`#ack_timeout=…`): a webhook's query belongs to its endpoint.
    Fragment,
    /// Nowhere: the local sinks (`file:`, `stdout:`) wait for no broker and take no timeout.
    Nowhere,
}

/// One sink as the registry knows it.
pub struct SinkKind {
    /// The URL schemes it answers to, without `:` (`nats` and `tls`).
    pub schemes: &'static [&'static str],
    /// How it is listed to users in errors and help (`nats://`).
    pub listed: &'static [&'static str],
    /// Where its URL keeps options; [`OptionsIn::Nowhere`] means it has no ack timeout.
    pub options: OptionsIn,
    /// Parses the URL and connects.
    pub connect: Connect,
    /// Checks the URL without contacting anything or creating a file, and returns the ack
    /// timeout it names (`None` for the local sinks).
    pub check: fn(&str) -> Result<Option<Duration>, Error>,
    /// Its independent reader, where it has one (`stdout:` has none).
    pub scratch: Option<MakeScratch>,
}

/// Boxes a connect future for [`SinkKind::connect`].
pub fn boxed<'a, S: Sink + 'static>(
    connect: impl std::future::Future<Output = Result<S, Error>> + Send + 'a,
) -> Connecting<'a> {
    Box::pin(async move { Ok(Arc::new(connect.await?) as Arc<dyn Sink>) })
}

/// The scheme of `url`: what comes before the first `:` (empty without one).
pub fn scheme(url: &str) -> &str {
    url.split_once(':').map(|(s, _)| s).unwrap_or("")
}

/// The entry of `kinds` whose schemes include `url`'s.
pub fn find<'k>(kinds: &'k [SinkKind], url: &str) -> Option<&'k SinkKind> {
    let scheme = scheme(url);
    kinds.iter().find(|k| k.schemes.contains(&scheme))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_scheme_belongs_to_one_sink_and_every_sink_is_listed() {
        let mut seen = std::collections::HashSet::new();
        for k in crate::SINKS {
            assert!(!k.listed.is_empty(), "{:?} is listed nowhere", k.schemes);
            for s in k.schemes {
                assert!(seen.insert(*s), "scheme `{s}` is claimed twice");
                assert!(std::ptr::eq(
                    find(crate::SINKS, &format!("{s}:x")).unwrap(),
                    k
                ));
            }
        }
        assert!(find(crate::SINKS, "pulsar://h").is_none());
        assert!(find(crate::SINKS, "no-scheme").is_none());
    }
}
