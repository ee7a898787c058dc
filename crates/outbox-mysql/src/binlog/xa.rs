//! XA transactions in the binlog (Java's JTA, PHP's `XA START`): how a prepared transaction's
//! rows and its later `XA COMMIT` / `XA ROLLBACK` are told apart and matched.
//!
//! On both servers `XA PREPARE` writes the transaction's rows to the binlog at once, as a group
//! that ends with an `XA_PREPARE_LOG_EVENT` instead of a commit; the outcome comes later, as
//! a statement of its own (`XA COMMIT X'…',X'…',n` or `XA ROLLBACK …`), possibly after other
//! transactions. The reader holds a prepared group's rows by its xid until then (see
//! `reader.rs`). An xid is kept as the server writes it in those statements:
//! `X'<gtrid hex>',X'<bqual hex>',<formatID>`, upper case, so the two forms compare equal.

/// A prepared group's end: its xid, and whether it is a one-phase commit (MySQL writes
/// `XA COMMIT … ONE PHASE` as a prepare event with this flag: committed at once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Prepared {
    pub xid: String,
    pub one_phase: bool,
}

/// The body of an `XA_PREPARE_LOG_EVENT`: one byte `one_phase`, then `formatID`,
/// `gtrid_length`, `bqual_length` (4 bytes each, little-endian), then the gtrid and bqual.
/// `None` when it is shorter than it says.
pub(super) fn prepared(body: &[u8]) -> Option<Prepared> {
    let word = |at: usize| -> Option<u32> {
        body.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let one_phase = *body.first()? != 0;
    let format = word(1)?;
    let gtrid = usize::try_from(word(5)?).ok()?;
    let bqual = usize::try_from(word(9)?).ok()?;
    let data = body.get(13..13 + gtrid + bqual)?;
    Some(Prepared {
        xid: format!(
            "X'{}',X'{}',{format}",
            hex(&data[..gtrid]),
            hex(&data[gtrid..])
        ),
        one_phase,
    })
}

/// What a statement does to a prepared transaction: `(true, xid)` for `XA COMMIT xid`,
/// `(false, xid)` for `XA ROLLBACK xid`; `None` for any other statement.
pub(super) fn outcome(query: &[u8]) -> Option<(bool, String)> {
    let text = std::str::from_utf8(query).ok()?.trim();
    let upper = text.to_ascii_uppercase();
    let (commit, rest) = if let Some(rest) = upper.strip_prefix("XA COMMIT ") {
        (true, rest)
    } else if let Some(rest) = upper.strip_prefix("XA ROLLBACK ") {
        (false, rest)
    } else {
        return None;
    };
    let rest = rest.trim().trim_end_matches("ONE PHASE").trim();
    Some((commit, rest.split_whitespace().collect()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prepare_event_and_its_outcome_name_the_same_xid() {
        let mut body = vec![0u8];
        body.extend(1u32.to_le_bytes());
        body.extend(2u32.to_le_bytes());
        body.extend(1u32.to_le_bytes());
        body.extend(b"x1b");
        let p = prepared(&body).unwrap();
        assert_eq!(p.xid, "X'7831',X'62',1");
        assert!(!p.one_phase);
        assert_eq!(
            outcome(b"XA COMMIT X'7831',X'62',1"),
            Some((true, p.xid.clone()))
        );
        assert_eq!(
            outcome(b"xa rollback X'7831',X'62',1"),
            Some((false, p.xid))
        );
        assert_eq!(outcome(b"COMMIT"), None);
        assert_eq!(outcome(b"XA END X'7831',X'',1"), None);
        assert_eq!(prepared(&body[..10]), None);
    }
}
