//! The parts of an outbox deployment that reach the database, and the grant of one part's least
//! privileges to a database role or account (`outbox migrate --grant relay=outbox_relay`). What
//! each part may do on each backend is written in docs/roles.md; the backends apply it.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};

/// A part of the deployment, by what it does to the outbox tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// The application: inserts its own rows (never `seq`, `txid` or the relay's columns), and on
    /// PostgreSQL in CDC mode writes logical messages through `outbox_emit`.
    Writer,
    /// `outbox relay`: reads the messages, keeps positions, leases, parked rows and members, and
    /// maintains storage (segments ahead of the writers and retention).
    Relay,
    /// The on-call engineer: `status`, `failed`, `redrive`, the console (what the reader may, plus
    /// redriving failed messages with an audited reason).
    Operator,
    /// Dashboards and `console --read-only`: reads every outbox table, changes nothing.
    Reader,
}

impl Part {
    /// Every part, in the order docs/roles.md lists them.
    pub const ALL: [Part; 4] = [Part::Writer, Part::Relay, Part::Operator, Part::Reader];

    /// The name used on the command line and stored with a grant: `writer`, `relay`, `operator`,
    /// `reader`.
    pub fn as_str(self) -> &'static str {
        match self {
            Part::Writer => "writer",
            Part::Relay => "relay",
            Part::Operator => "operator",
            Part::Reader => "reader",
        }
    }
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Part {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Part::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                Error::config(format!(
                    "`{s}` is not a part: use writer, relay, operator or reader (docs/roles.md)"
                ))
            })
    }
}

/// One part's privileges given to one database role (PostgreSQL) or account (MySQL/MariaDB).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Grant {
    /// What the grantee does.
    pub part: Part,
    /// The role's name (PostgreSQL), or the account's user, optionally `user@host`
    /// (MySQL/MariaDB; the host defaults to `%`).
    pub grantee: String,
}

/// The longest grantee accepted: PostgreSQL's 63-byte names; a MySQL account's user (80 on
/// MariaDB, 32 on MySQL) plus its host fits too.
const MAX_GRANTEE: usize = 128;

impl Grant {
    /// A grant of `part` to `grantee`, checked (see [`Grant::from_str`] for the form).
    pub fn new(part: Part, grantee: &str) -> Result<Self> {
        let (user, host) = match grantee.split_once('@') {
            Some((u, h)) => (u, Some(h)),
            None => (grantee, None),
        };
        let user_ok = !user.is_empty()
            && user
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            && !user.starts_with('-');
        let host_ok = host.is_none_or(|h| {
            !h.is_empty()
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '%' | '_' | '-' | ':'))
        });
        if !user_ok || !host_ok || grantee.len() > MAX_GRANTEE {
            return Err(Error::config(format!(
                "`{grantee}` is not a role name this command accepts: letters, digits, `_` and \
                 `-` (MySQL/MariaDB: `user` or `user@host`), at most {MAX_GRANTEE} characters"
            )));
        }
        Ok(Self {
            part,
            grantee: grantee.to_string(),
        })
    }

    /// The grantee's user name (before any `@host`).
    pub fn user(&self) -> &str {
        self.grantee.split('@').next().unwrap_or(&self.grantee)
    }

    /// The grantee's host (`%` when none was given): MySQL/MariaDB accounts only.
    pub fn host(&self) -> &str {
        self.grantee.split_once('@').map_or("%", |(_, h)| h)
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.part, self.grantee)
    }
}

impl FromStr for Grant {
    type Err = Error;

    /// `PART=NAME`: `writer=app_rw`, `relay=outbox_relay`, `operator=oncall`,
    /// `reader=grafana`; on MySQL/MariaDB `relay=outbox_relay@10.0.0.%`.
    fn from_str(s: &str) -> Result<Self> {
        let (part, grantee) = s.split_once('=').ok_or_else(|| {
            Error::config(format!(
                "`{s}` is not PART=ROLE: write for example --grant writer=app_rw or \
                 --grant relay=outbox_relay"
            ))
        })?;
        Grant::new(part.trim().parse()?, grantee.trim())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_parse_from_part_equals_role() {
        let g: Grant = "relay=outbox_relay".parse().unwrap();
        assert_eq!(g.part, Part::Relay);
        assert_eq!(g.grantee, "outbox_relay");
        assert_eq!(g.to_string(), "relay=outbox_relay");
        let m: Grant = "writer=app@10.0.0.%".parse().unwrap();
        assert_eq!((m.user(), m.host()), ("app", "10.0.0.%"));
        assert_eq!(g.host(), "%");
        for p in Part::ALL {
            assert_eq!(p.as_str().parse::<Part>().unwrap(), p);
        }
    }

    #[test]
    fn bad_parts_and_names_are_refused_with_the_form() {
        for bad in [
            "relay",
            "owner=x",
            "relay=",
            "relay=a;b",
            "relay=a b",
            "relay=\"x\"",
            "relay=-x",
            "writer=a@",
            "writer=a@b c",
        ] {
            let e = bad.parse::<Grant>().unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Config, "{bad}");
        }
        let long = format!("reader={}", "a".repeat(200));
        assert!(long.parse::<Grant>().is_err());
    }
}
