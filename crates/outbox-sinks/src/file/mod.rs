//! JSON-lines file sink (`file:path.jsonl`): appends, then fsyncs before acknowledging.

mod reader;
mod sink;

pub(crate) use reader::scratch;
pub use reader::FileReader;
pub use sink::FileSink;
