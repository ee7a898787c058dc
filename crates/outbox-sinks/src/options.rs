//! Values of sink URL options shared by the sinks that take them: durations and byte sizes.

use std::time::Duration;

use outbox_core::Error;

/// Parses a duration option such as `5s`, `500ms` or `2m`; the error names the option.
pub(crate) fn duration(sink: &str, name: &str, value: &str) -> Result<Duration, Error> {
    humantime::parse_duration(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            Error::config(format!(
                "{sink} sink option {name}=`{value}`: expected a duration above zero such as 5s \
                 or 500ms"
            ))
        })
}

/// Parses a size option such as `128MiB`, `512KiB`, `1MB` or a plain number of bytes; the
/// error names the option.
pub(crate) fn bytes(sink: &str, name: &str, value: &str) -> Result<u64, Error> {
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (num, unit) = value.split_at(split);
    let unit_size: Option<u64> = match unit {
        "" | "B" => Some(1),
        "KiB" => Some(1 << 10),
        "MiB" => Some(1 << 20),
        "GiB" => Some(1 << 30),
        "KB" | "kB" => Some(1_000),
        "MB" => Some(1_000_000),
        "GB" => Some(1_000_000_000),
        _ => None,
    };
    num.parse::<u64>()
        .ok()
        .zip(unit_size)
        .and_then(|(n, u)| n.checked_mul(u))
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            Error::config(format!(
                "{sink} sink option {name}=`{value}`: expected a size above zero such as \
                 128MiB, 512KiB or 1048576"
            ))
        })
}

/// The `name=value` pairs of a URL's query (`?a=1&b=2`), with the URL before it.
pub(crate) fn split_query(url: &str) -> (&str, Vec<(&str, &str)>) {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let pairs = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect();
    (base, pairs)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn durations_and_sizes_parse_and_bad_values_name_the_option() {
        assert_eq!(
            duration("x", "t", "250ms").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(duration("x", "t", "2m").unwrap(), Duration::from_secs(120));
        let e = duration("x", "ack_timeout", "soon")
            .unwrap_err()
            .to_string();
        assert!(e.contains("ack_timeout"), "{e}");
        assert!(duration("x", "t", "0s").is_err());
        assert_eq!(bytes("x", "s", "128MiB").unwrap(), 128 << 20);
        assert_eq!(bytes("x", "s", "1000").unwrap(), 1000);
        assert_eq!(bytes("x", "s", "2KB").unwrap(), 2000);
        assert!(bytes("x", "max", "lots")
            .unwrap_err()
            .to_string()
            .contains("max"));
        assert!(bytes("x", "s", "0").is_err());
        assert!(bytes("x", "s", "99999999999999999999GiB").is_err());
    }

    #[test]
    fn queries_split_into_pairs() {
        let (base, pairs) = split_query("amqp://h/v?a=1&b=&c");
        assert_eq!(base, "amqp://h/v");
        assert_eq!(pairs, vec![("a", "1"), ("b", ""), ("c", "")]);
        assert_eq!(split_query("redis://h").1, vec![]);
    }
}
