//! What CDC mode checks of the server before it reads the stream (at start and at every
//! reconnection): that the publication still publishes every row of the message table as
//! `outbox migrate --cdc` made it (a row filter, a column list, a table dropped from it or
//! `publish_via_partition_root = false` make rows vanish from the stream, and checkpoints would
//! then move the positions past them), and that no setting lets the relay's own replication
//! connection be chosen as a synchronous standby (every commit of the cluster would then wait
//! for the broker).

use outbox_core::{Error, ErrorKind, Result};
use sqlx::PgPool;

use crate::cdc::setup::CdcNames;
use crate::error::map_sqlx_error;

const PUBLICATION_SQL: &str = include_str!("../../queries/cdc_publication.sql");

/// The publication as the server has it.
#[derive(Debug, sqlx::FromRow)]
struct Publication {
    pubinsert: bool,
    pubviaroot: bool,
    publishes_table: bool,
    row_filter: Option<String>,
    column_list: Option<String>,
}

/// Refuses, naming what differs and the statement that mends it, a publication that would not
/// carry every row of the message table to the relay.
pub async fn check_publication(pool: &PgPool, names: &CdcNames) -> Result<()> {
    let found: Option<Publication> = sqlx::query_as(PUBLICATION_SQL)
        .bind(&names.publication)
        .bind(names.schema.as_str())
        .fetch_optional(pool)
        .await
        .map_err(|e| map_sqlx_error("reading the CDC publication", e))?;
    publication_verdict(names, found.as_ref())
}

fn publication_verdict(names: &CdcNames, found: Option<&Publication>) -> Result<()> {
    let (p, table) = (
        &names.publication,
        format!("{}.outbox", names.schema.as_str()),
    );
    let Some(found) = found else {
        return Err(drift(format!(
            "the publication `{p}` does not exist: run `outbox migrate --cdc` (same schema)"
        )));
    };
    let mut wrong = Vec::new();
    if !found.pubinsert {
        wrong.push(format!(
            "it does not publish inserts (ALTER PUBLICATION {p} SET (publish = 'insert'))"
        ));
    }
    if !found.pubviaroot {
        wrong.push(format!(
            "publish_via_partition_root is off, so rows would arrive as the table's segments \
             (ALTER PUBLICATION {p} SET (publish_via_partition_root = true))"
        ));
    }
    if !found.publishes_table {
        wrong.push(format!(
            "it does not include {table} (ALTER PUBLICATION {p} ADD TABLE {table})"
        ));
    }
    if found.row_filter.is_some() {
        wrong.push(format!(
            "it filters the rows of {table} (a WHERE clause); rows it filters out would never \
             be published (ALTER PUBLICATION {p} SET TABLE {table})"
        ));
    }
    if found.column_list.is_some() {
        wrong.push(format!(
            "it publishes some columns of {table} only (ALTER PUBLICATION {p} SET TABLE {table})"
        ));
    }
    if wrong.is_empty() {
        return Ok(());
    }
    Err(drift(format!(
        "the publication `{p}` no longer carries every row of the message table: {}; the relay \
         does not read the stream until it does",
        wrong.join("; ")
    )))
}

fn drift(text: String) -> Error {
    Error::new(ErrorKind::Config, format!("CDC publication drift: {text}"))
}

/// The standby names in `synchronous_standby_names` (`FIRST 2 (a, "b")`, `ANY 1 (*)`, `a, b`),
/// lower-cased unless quoted, as PostgreSQL compares them.
pub fn standby_names(setting: &str) -> Vec<String> {
    let s = setting.trim();
    let inner = match (s.find('('), s.rfind(')')) {
        (Some(open), Some(close)) if open < close => &s[open + 1..close],
        _ => s,
    };
    inner
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(
            |n| match n.strip_prefix('"').and_then(|n| n.strip_suffix('"')) {
                Some(quoted) => quoted.replace("\"\"", "\""),
                None => n.to_ascii_lowercase(),
            },
        )
        .collect()
}

/// The `application_name` of the relay's replication connection for `names`' slot.
pub fn application_name(names: &CdcNames) -> String {
    format!("outbox-cdc:{}", names.slot)
}

/// Refuses a `synchronous_standby_names` that could pick the relay's replication connection
/// as a synchronous standby: `*`, or its own application name. Returns whether commits wait
/// for a synchronous standby at all (then the relay publishes a commit only once the standby
/// has it: see [`crate::cdc::sync`]).
pub async fn check_synchronous_standbys(pool: &PgPool, names: &CdcNames) -> Result<bool> {
    let setting: String =
        sqlx::query_scalar(include_str!("../../queries/synchronous_standby_names.sql"))
            .fetch_one(pool)
            .await
            .map_err(|e| map_sqlx_error("reading synchronous_standby_names", e))?;
    synchronous_verdict(names, &setting)
}

fn synchronous_verdict(names: &CdcNames, setting: &str) -> Result<bool> {
    let own = application_name(names);
    let listed = standby_names(setting);
    if listed.iter().any(|n| n == "*" || *n == own) {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "synchronous_standby_names = '{setting}' lets this relay's replication connection \
                 ({own}) be chosen as a synchronous standby: every commit of the cluster would \
                 then wait for the broker. Name the standbys instead (for example \
                 synchronous_standby_names = 'FIRST 1 (standby1)')"
            ),
        ));
    }
    Ok(!listed.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Schema;

    fn names() -> CdcNames {
        CdcNames::new(&Schema::new("shop").unwrap(), "relay").unwrap()
    }

    #[test]
    fn standby_names_are_read_as_postgresql_reads_them() {
        assert_eq!(standby_names(""), Vec::<String>::new());
        assert_eq!(standby_names("node_b"), vec!["node_b"]);
        assert_eq!(standby_names("FIRST 2 (A, \"B c\")"), vec!["a", "B c"]);
        assert_eq!(standby_names("ANY 1 (*)"), vec!["*"]);
        assert_eq!(standby_names("s1, s2"), vec!["s1", "s2"]);
    }

    #[test]
    fn a_setting_that_could_pick_the_relay_is_refused() {
        let n = names();
        assert!(!synchronous_verdict(&n, "").unwrap());
        assert!(synchronous_verdict(&n, "FIRST 1 (node_b)").unwrap());
        for bad in ["*", "ANY 1 (*)", "\"outbox-cdc:outbox_shop_relay\""] {
            let e = synchronous_verdict(&n, bad).unwrap_err();
            assert!(e.to_string().contains("synchronous standby"), "{e}");
        }
    }

    #[test]
    fn each_kind_of_drift_is_named_with_its_fix() {
        let n = names();
        let ok = Publication {
            pubinsert: true,
            pubviaroot: true,
            publishes_table: true,
            row_filter: None,
            column_list: None,
        };
        publication_verdict(&n, Some(&ok)).unwrap();
        assert!(publication_verdict(&n, None)
            .unwrap_err()
            .to_string()
            .contains("does not exist"));
        let cases = [
            (
                Publication {
                    pubviaroot: false,
                    ..ok_like(&ok)
                },
                "publish_via_partition_root",
            ),
            (
                Publication {
                    pubinsert: false,
                    ..ok_like(&ok)
                },
                "publish = 'insert'",
            ),
            (
                Publication {
                    publishes_table: false,
                    ..ok_like(&ok)
                },
                "ADD TABLE shop.outbox",
            ),
            (
                Publication {
                    row_filter: Some("{OPEXPR}".into()),
                    ..ok_like(&ok)
                },
                "filters the rows",
            ),
            (
                Publication {
                    column_list: Some("1 2".into()),
                    ..ok_like(&ok)
                },
                "some columns",
            ),
        ];
        for (p, want) in cases {
            let e = publication_verdict(&n, Some(&p)).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config);
            assert!(e.to_string().contains(want), "{e}");
        }
    }

    fn ok_like(p: &Publication) -> Publication {
        Publication {
            pubinsert: p.pubinsert,
            pubviaroot: p.pubviaroot,
            publishes_table: p.publishes_table,
            row_filter: p.row_filter.clone(),
            column_list: p.column_list.clone(),
        }
    }
}
