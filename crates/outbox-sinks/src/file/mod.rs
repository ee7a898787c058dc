//! JSON-lines file sink (`file:path.jsonl`): appends, then fsyncs before acknowledging.

mod sink;

pub use sink::FileSink;
