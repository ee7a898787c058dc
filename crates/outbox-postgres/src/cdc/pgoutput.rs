//! A decoder for the `pgoutput` row messages a CDC relay reads: `Relation` (a table's columns)
//! and `Insert` (one new row, its values as text). Begin, Commit and logical messages are parsed
//! by the replication client; every other message (Update, Delete, Truncate, Type, Origin) is
//! reported by its tag and ignored, since the publication carries inserts only.
//!
//! The format is PostgreSQL's "Logical Replication Message Formats", protocol version 1 (no
//! streaming of transactions in progress: a transaction arrives once it committed).

use bytes::Bytes;

/// A table as the stream describes it, sent before the first change of the table in a session
/// and again whenever its definition changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// The table's OID, which later `Insert` messages name.
    pub oid: u32,
    /// Its schema.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Column names, in the order of a tuple's values.
    pub columns: Vec<String>,
}

/// One decoded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A table's description.
    Relation(Relation),
    /// A new row of the table `relation`: each column's value as text, `None` for NULL.
    Insert {
        /// The table's OID.
        relation: u32,
        /// Values in column order.
        values: Vec<Option<Bytes>>,
    },
    /// Any other message, by its tag (`U`, `D`, `T`, `Y`, `O`, …).
    Other(u8),
}

/// Why a message could not be decoded: the stream is not what protocol version 1 describes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pgoutput: {0}")]
pub struct DecodeError(String);

/// A cursor over one message's bytes.
struct Reader<'a> {
    data: &'a Bytes,
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], DecodeError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.data.len());
        let Some(end) = end else {
            return Err(DecodeError(format!("message ends inside {what}")));
        };
        let s = &self.data[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self, what: &str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, DecodeError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &str) -> Result<u32, DecodeError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A NUL-terminated string.
    fn cstr(&mut self, what: &str) -> Result<String, DecodeError> {
        let rest = &self.data[self.at..];
        let Some(len) = rest.iter().position(|&b| b == 0) else {
            return Err(DecodeError(format!("{what} has no terminating NUL")));
        };
        let s = String::from_utf8(rest[..len].to_vec())
            .map_err(|_| DecodeError(format!("{what} is not UTF-8")))?;
        self.at += len + 1;
        Ok(s)
    }

    /// A zero-copy slice of the message.
    fn bytes(&mut self, n: usize, what: &str) -> Result<Bytes, DecodeError> {
        let start = self.at;
        self.take(n, what)?;
        Ok(self.data.slice(start..start + n))
    }
}

/// Decodes one `pgoutput` message (the payload of an XLogData record).
pub fn decode(data: &Bytes) -> Result<Change, DecodeError> {
    let mut r = Reader { data, at: 0 };
    match r.u8("the message tag")? {
        b'R' => {
            let oid = r.u32("the relation OID")?;
            let namespace = r.cstr("the relation's schema")?;
            let name = r.cstr("the relation's name")?;
            let _replica_identity = r.u8("the replica identity")?;
            let n = r.u16("the column count")?;
            let mut columns = Vec::with_capacity(usize::from(n));
            for _ in 0..n {
                let _flags = r.u8("a column's flags")?;
                columns.push(r.cstr("a column's name")?);
                let _type_oid = r.u32("a column's type")?;
                let _typmod = r.u32("a column's type modifier")?;
            }
            Ok(Change::Relation(Relation {
                oid,
                namespace,
                name,
                columns,
            }))
        }
        b'I' => {
            let relation = r.u32("the relation OID")?;
            match r.u8("the tuple marker")? {
                b'N' => {}
                other => {
                    return Err(DecodeError(format!(
                        "an insert's tuple starts with {:?}, not 'N'",
                        other as char
                    )))
                }
            }
            let n = r.u16("the tuple's column count")?;
            let mut values = Vec::with_capacity(usize::from(n));
            for _ in 0..n {
                match r.u8("a value's kind")? {
                    b'n' => values.push(None),
                    b't' => {
                        let len = r.u32("a value's length")? as usize;
                        values.push(Some(r.bytes(len, "a value")?));
                    }
                    b'u' => {
                        return Err(DecodeError(
                            "an insert holds an unchanged TOAST value, which only updates may"
                                .into(),
                        ))
                    }
                    other => {
                        return Err(DecodeError(format!(
                            "a value of kind {:?} (binary values are not requested)",
                            other as char
                        )))
                    }
                }
            }
            Ok(Change::Insert { relation, values })
        }
        tag => Ok(Change::Other(tag)),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A `Relation` message as the server writes it.
    pub(crate) fn relation(oid: u32, namespace: &str, name: &str, columns: &[&str]) -> Bytes {
        let mut b = vec![b'R'];
        b.extend(oid.to_be_bytes());
        for s in [namespace, name] {
            b.extend(s.as_bytes());
            b.push(0);
        }
        b.push(b'd');
        b.extend((columns.len() as u16).to_be_bytes());
        for c in columns {
            b.push(0);
            b.extend(c.as_bytes());
            b.push(0);
            b.extend(25u32.to_be_bytes());
            b.extend((-1i32).to_be_bytes());
        }
        Bytes::from(b)
    }

    /// An `Insert` message as the server writes it.
    pub(crate) fn insert(oid: u32, values: &[Option<&str>]) -> Bytes {
        let mut b = vec![b'I'];
        b.extend(oid.to_be_bytes());
        b.push(b'N');
        b.extend((values.len() as u16).to_be_bytes());
        for v in values {
            match v {
                None => b.push(b'n'),
                Some(v) => {
                    b.push(b't');
                    b.extend((v.len() as u32).to_be_bytes());
                    b.extend(v.as_bytes());
                }
            }
        }
        Bytes::from(b)
    }

    #[test]
    fn a_relation_and_an_insert_decode() {
        let rel = decode(&relation(16400, "s1", "outbox", &["id", "topic"])).unwrap();
        assert_eq!(
            rel,
            Change::Relation(Relation {
                oid: 16400,
                namespace: "s1".into(),
                name: "outbox".into(),
                columns: vec!["id".into(), "topic".into()],
            })
        );
        let ins = decode(&insert(16400, &[Some("abc"), None])).unwrap();
        assert_eq!(
            ins,
            Change::Insert {
                relation: 16400,
                values: vec![Some(Bytes::from_static(b"abc")), None],
            }
        );
    }

    #[test]
    fn other_messages_are_named_by_their_tag() {
        assert_eq!(
            decode(&Bytes::from_static(b"Yxyz")).unwrap(),
            Change::Other(b'Y')
        );
    }

    #[test]
    fn truncated_and_odd_messages_are_errors_not_panics() {
        let full = insert(7, &[Some("hello")]);
        for cut in 0..full.len() {
            let e = decode(&full.slice(..cut));
            assert!(e.is_err(), "cut at {cut}");
        }
        let rel = relation(7, "s", "t", &["a"]);
        for cut in 1..rel.len() {
            assert!(decode(&rel.slice(..cut)).is_err(), "cut at {cut}");
        }
        let mut unchanged = vec![b'I'];
        unchanged.extend(7u32.to_be_bytes());
        unchanged.extend([b'N', 0, 1, b'u']);
        assert!(decode(&Bytes::from(unchanged)).is_err());
        let huge = {
            let mut b = vec![b'I'];
            b.extend(7u32.to_be_bytes());
            b.extend([b'N', 0, 1, b't']);
            b.extend(u32::MAX.to_be_bytes());
            Bytes::from(b)
        };
        assert!(decode(&huge).is_err(), "a length past the end");
    }
}
