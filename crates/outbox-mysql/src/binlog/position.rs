//! [`BinlogPosition`]: a place in a server's binlog, as a file name and a byte offset in it.

use std::cmp::Ordering;
use std::fmt;

/// A place in the binlog: the file (`binlog.000042`) and the offset of the next event in it.
/// Positions order by the file's number, then the offset: files are numbered in the order
/// the server wrote them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BinlogPosition {
    /// The file's name as the server reports it (`SHOW BINARY LOGS`), without a directory.
    pub file: String,
    /// The offset of the next event in `file`; 4 is the first event of a file.
    pub offset: u64,
}

impl BinlogPosition {
    /// A position at `offset` in `file`.
    pub fn new(file: impl Into<String>, offset: u64) -> Self {
        Self {
            file: file.into(),
            offset,
        }
    }

    /// The number the server gave the file (the part after the last dot), if it has one.
    pub fn file_number(&self) -> Option<u64> {
        self.file.rsplit_once('.')?.1.parse().ok()
    }
}

impl Ord for BinlogPosition {
    fn cmp(&self, other: &Self) -> Ordering {
        // By number first: `binlog.1000000` follows `binlog.999999`, which a comparison of
        // the names would put first.
        (self.file_number(), &self.file, self.offset).cmp(&(
            other.file_number(),
            &other.file,
            other.offset,
        ))
    }
}

impl PartialOrd for BinlogPosition {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for BinlogPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_order_by_file_number_then_offset() {
        let a = BinlogPosition::new("binlog.000009", 900);
        let b = BinlogPosition::new("binlog.000010", 4);
        let c = BinlogPosition::new("binlog.000010", 5);
        let d = BinlogPosition::new("binlog.1000000", 4);
        assert!(a < b && b < c && c < d);
        assert!(BinlogPosition::new("binlog.999999", 10) < d);
        assert_eq!(a.to_string(), "binlog.000009:900");
        assert_eq!(d.file_number(), Some(1_000_000));
    }
}
