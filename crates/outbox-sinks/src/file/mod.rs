//! JSON-lines file sink (`file:path.jsonl`): appends, then fsyncs before acknowledging.

mod reader;
mod sink;

pub use reader::FileReader;
pub use sink::FileSink;

/// This sink's entry in [`crate::SINKS`].
pub(crate) const KIND: crate::registry::SinkKind = crate::registry::SinkKind {
    schemes: &["file"],
    listed: &["file:"],
    options: crate::registry::OptionsIn::Nowhere,
    connect: connect_url,
    check: |url| FileSink::path_of(url).map(|_| None),
    scratch: Some(make_scratch),
};

fn connect_url(url: &str) -> crate::registry::Connecting<'_> {
    crate::registry::boxed(async move { FileSink::from_url(url) })
}

fn make_scratch<'a>(
    url: &'a str,
    options: &'a crate::read::ScratchOptions,
) -> crate::registry::Making<'a> {
    Box::pin(async move { reader::scratch(url, options) })
}
