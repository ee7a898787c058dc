//! One grammar for every option a user writes, in a sink or source URL, a config file, an
//! environment variable or a flag: durations, sizes, booleans, bounded numbers, and URL query
//! strings. Each value type is parsed here once, with one error text, so `ack_timeout=1h` means
//! the same to every sink and source, and a value out of its bounds is refused wherever it is
//! given.
//!
//! - **Durations**: a whole number of seconds (`30`), or amounts with units, alone or combined,
//!   with or without spaces, decimals allowed: `500ms`, `1.5s`, `2m`, `1m30s`, `1h 15m`, `7d`
//!   (`us`, `ms`, `s`, `m`, `h`, `d`, `w` and their long forms, as `humantime` writes them).
//! - **Sizes**: a whole number of bytes (`1048576`) or one with a unit: `B`, `KiB`, `MiB`, `GiB`
//!   (powers of two), `kB`/`KB`, `MB`, `GB` (powers of ten); `16 MiB` and `16MiB` alike.
//! - **Booleans**: `true`/`false`, `yes`/`no`, `on`/`off`, `1`/`0`, in any case.
//! - **Queries** (`?a=1&b=2`, or after `#` for the webhook sink): keys and values are
//!   percent-decoded (`%20` is a space, `+` stays a plus: MQTT topics use it), a key given twice
//!   or not known to the scheme is refused, and every error names the option and the scheme, never
//!   the value of an option whose name says it is a secret.
//! - **TLS and credentials** (`tls_ca`, `tls_cert`, `tls_key`, `password_file`, …): read from a
//!   parsed query by [`crate::tls`], the same on every URL that speaks TLS.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

use crate::{redact, Error};

/// The longest any timeout option may be: a timeout past a day is a typo, never a plan.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Parses a duration in the module's grammar; the error says what was expected.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err(DURATION_EXPECTED.into());
    }
    if t.bytes().all(|b| b.is_ascii_digit()) {
        return t
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| DURATION_EXPECTED.into());
    }
    humantime::parse_duration(t).map_err(|_| DURATION_EXPECTED.into())
}

const DURATION_EXPECTED: &str = "a duration such as 500ms, 5s, 2m, 1m30s or 1h";

/// Parses a size in bytes in the module's grammar.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let unit: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return Err(SIZE_EXPECTED.into()),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .ok_or_else(|| SIZE_EXPECTED.into())
}

const SIZE_EXPECTED: &str = "a size such as 1048576, 512KiB or 16MiB";

/// Parses a boolean in the module's grammar.
pub fn parse_bool(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" => Ok(false),
        _ => Err("true or false (or yes/no, on/off, 1/0)".into()),
    }
}

/// A duration setting (a flag, an environment variable, a config file value) in the module's
/// grammar; in a file, a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl std::str::FromStr for Dur {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_duration(s)
            .map(Dur)
            .map_err(|expected| format!("`{s}` is not a duration: expected {expected}"))
    }
}

impl<'de> serde::Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A size setting in bytes, in the module's grammar; in a file, a string or an integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub usize);

impl std::str::FromStr for Size {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_size(s)
            .ok()
            .and_then(|n| usize::try_from(n).ok())
            .map(Size)
            .ok_or_else(|| format!("`{s}` is not a size: expected {SIZE_EXPECTED}"))
    }
}

impl<'de> serde::Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(usize),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Number(n) => Ok(Size(n)),
            Raw::Text(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// The range a value must lie in, inclusive at both ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds<T> {
    /// The least value accepted.
    pub min: T,
    /// The greatest value accepted.
    pub max: T,
}

impl<T> Bounds<T> {
    /// `min..=max`.
    pub const fn new(min: T, max: T) -> Self {
        Self { min, max }
    }
}

impl Bounds<Duration> {
    /// A timeout: above zero, at most [`MAX_TIMEOUT`].
    pub const TIMEOUT: Self = Self::new(Duration::from_millis(1), MAX_TIMEOUT);
    /// Any duration up to [`MAX_TIMEOUT`], zero included.
    pub const UP_TO_A_DAY: Self = Self::new(Duration::ZERO, MAX_TIMEOUT);
}

/// How a value is shown in a bound: durations as `humantime` writes them.
pub trait Shown {
    /// The value as a user would write it.
    fn shown(&self) -> String;
}

impl Shown for Duration {
    fn shown(&self) -> String {
        humantime::format_duration(*self).to_string()
    }
}

macro_rules! shown_as_display {
    ($($t:ty),*) => {$(
        impl Shown for $t {
            fn shown(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
shown_as_display!(u8, u16, u32, u64, usize, i16, i32, i64);

impl<T: PartialOrd + Shown + Copy> Bounds<T> {
    /// `value` when within bounds; otherwise what was expected.
    pub fn check(&self, value: T) -> Result<T, String> {
        if value < self.min {
            Err(format!("at least {}", self.min.shown()))
        } else if value > self.max {
            Err(format!("at most {}", self.max.shown()))
        } else {
            Ok(value)
        }
    }
}

/// Who reads an option, for error texts: "sink option …", "source option …".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A sink URL's option.
    Sink,
    /// An inbox source URL's option.
    Source,
}

impl Role {
    fn word(self) -> &'static str {
        match self {
            Role::Sink => "sink",
            Role::Source => "source",
        }
    }
}

/// The error text for `key=value` given to `role`: the value itself is shown unless the key
/// names a secret.
pub fn invalid(role: Role, key: &str, value: &str, expected: &str) -> Error {
    invalid_shown(role, key, value, expected, redact::is_secret_name(key))
}

fn invalid_shown(role: Role, key: &str, value: &str, expected: &str, hide: bool) -> Error {
    let shown = if hide {
        "***".to_string()
    } else {
        value.to_string()
    };
    Error::config(format!(
        "{} option {key}=`{shown}`: expected {expected}",
        role.word()
    ))
}

/// The options of one URL, split, percent-decoded and checked against the scheme's known keys
/// once; typed getters parse each value in the module's grammar.
#[derive(Debug, Clone)]
pub struct QueryOptions {
    role: Role,
    scheme: String,
    values: BTreeMap<String, String>,
}

impl QueryOptions {
    /// Splits the query of `url` (after `?`): returns the URL before it and its options.
    /// Refuses a key not in `known` (the error lists them), a key given twice, and an escape
    /// that does not decode to UTF-8.
    pub fn from_url<'u>(
        role: Role,
        url: &'u str,
        known: &[&str],
    ) -> Result<(&'u str, Self), Error> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        Ok((base, Self::parse(role, scheme_of(url), query, known)?))
    }

    /// As [`from_url`](Self::from_url), for options after `#` (the webhook sink keeps `?` for
    /// the endpoint's own query).
    pub fn from_fragment<'u>(
        role: Role,
        url: &'u str,
        known: &[&str],
    ) -> Result<(&'u str, Self), Error> {
        let (base, fragment) = url.split_once('#').unwrap_or((url, ""));
        Ok((base, Self::parse(role, scheme_of(url), fragment, known)?))
    }

    /// Parses `query` (`a=1&b=2`, without its `?`) as the options of a `scheme` URL.
    pub fn parse(role: Role, scheme: &str, query: &str, known: &[&str]) -> Result<Self, Error> {
        let mut values = BTreeMap::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (raw_key, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = decode(raw_key).ok_or_else(|| {
                Error::config(format!(
                    "{} option `{}` of {scheme}://: not valid percent-encoded UTF-8",
                    role.word(),
                    redact::sanitize(raw_key)
                ))
            })?;
            if !known.contains(&key.as_str()) {
                return Err(Error::config(format!(
                    "{} option `{}` is not known for {scheme}:// (known: {})",
                    role.word(),
                    redact::sanitize(&key),
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )));
            }
            let value = decode(raw_value).ok_or_else(|| {
                Error::config(format!(
                    "{} option `{key}` of {scheme}://: its value is not valid percent-encoded \
                     UTF-8",
                    role.word()
                ))
            })?;
            if values.insert(key.clone(), value).is_some() {
                return Err(Error::config(format!(
                    "{} option `{key}` is given twice in a {scheme}:// URL",
                    role.word()
                )));
            }
        }
        Ok(Self {
            role,
            scheme: scheme.to_string(),
            values,
        })
    }

    /// The scheme the options belong to.
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// Who reads these options (in error texts).
    pub fn role(&self) -> Role {
        self.role
    }

    /// The error for `key=value`, which the caller found not to be `expected`.
    pub fn invalid(&self, key: &str, value: &str, expected: &str) -> Error {
        invalid(self.role, key, value, expected)
    }

    /// Whether `key` was given.
    pub fn has(&self, key: &str) -> bool {
        self.values.contains_key(key)
    }

    /// The decoded value of `key`, if given.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    /// The value of `key` when given, refused when empty.
    pub fn non_empty(&self, key: &str) -> Result<Option<&str>, Error> {
        match self.str(key) {
            Some("") => Err(invalid(self.role, key, "", "a value (it is empty)")),
            other => Ok(other),
        }
    }

    /// `key` as a duration within `bounds`. A duration is never a secret, whatever the key's
    /// name (`session_expiry`): the error always shows it.
    pub fn duration(&self, key: &str, bounds: Bounds<Duration>) -> Result<Option<Duration>, Error> {
        self.typed_shown(key, |v| parse_duration(v).and_then(|d| bounds.check(d)))
    }

    /// `key` as a whole number of seconds within `bounds` (for brokers that only take seconds).
    pub fn whole_seconds(
        &self,
        key: &str,
        bounds: Bounds<Duration>,
    ) -> Result<Option<Duration>, Error> {
        self.typed_shown(key, |v| {
            let d = parse_duration(v)?;
            if d.subsec_nanos() != 0 {
                return Err("a whole number of seconds, such as 30s or 2m".into());
            }
            bounds.check(d)
        })
    }

    /// `key` as a size in bytes within `bounds`.
    pub fn size(&self, key: &str, bounds: Bounds<u64>) -> Result<Option<u64>, Error> {
        self.typed(key, |v| parse_size(v).and_then(|n| bounds.check(n)))
    }

    /// `key` as a boolean.
    pub fn bool(&self, key: &str) -> Result<Option<bool>, Error> {
        self.typed(key, parse_bool)
    }

    /// `key` as a whole number within `bounds`.
    pub fn int<T>(&self, key: &str, bounds: Bounds<T>) -> Result<Option<T>, Error>
    where
        T: FromStr + PartialOrd + Shown + Copy + Display,
    {
        self.typed(key, |v| {
            let n = v.trim().parse::<T>().map_err(|_| {
                format!(
                    "a whole number from {} to {}",
                    bounds.min.shown(),
                    bounds.max.shown()
                )
            })?;
            bounds.check(n)
        })
    }

    /// `key` as one of `choices` (by name).
    pub fn one_of<T: Copy>(&self, key: &str, choices: &[(&str, T)]) -> Result<Option<T>, Error> {
        self.typed(key, |v| {
            choices
                .iter()
                .find(|(name, _)| *name == v)
                .map(|(_, t)| *t)
                .ok_or_else(|| {
                    let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
                    format!("one of {}", names.join(", "))
                })
        })
    }

    fn typed<T>(
        &self,
        key: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<Option<T>, Error> {
        self.parsed(key, parse, redact::is_secret_name(key))
    }

    /// As `typed`, for values that are never secrets: the error shows them.
    fn typed_shown<T>(
        &self,
        key: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<Option<T>, Error> {
        self.parsed(key, parse, false)
    }

    fn parsed<T>(
        &self,
        key: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
        hide: bool,
    ) -> Result<Option<T>, Error> {
        match self.str(key) {
            None => Ok(None),
            Some(v) => parse(v)
                .map(Some)
                .map_err(|expected| invalid_shown(self.role, key, v, &expected, hide)),
        }
    }

    /// The options named in `keys` that were given, encoded again as a query (`a=1&b=2`, no
    /// `?`), to hand on to another parser of this module (a source forwarding its sink options).
    pub fn forward(&self, keys: &[&str]) -> String {
        self.values
            .iter()
            .filter(|(k, _)| keys.contains(&k.as_str()))
            .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
            .collect::<Vec<_>>()
            .join("&")
    }
}

/// `url` with `key=value` added to its query (after `mark`, `?` or `#`) unless the query already
/// sets `key`.
pub fn with_default(url: &str, mark: char, key: &str, value: &str) -> String {
    let query = url.split_once(mark).map_or("", |(_, q)| q);
    let set = query
        .split('&')
        .any(|p| p.split_once('=').map_or(p, |(k, _)| k) == key);
    if set {
        url.to_string()
    } else if url.contains(mark) {
        let sep = if query.is_empty() || query.ends_with('&') {
            ""
        } else {
            "&"
        };
        format!("{url}{sep}{key}={value}")
    } else {
        format!("{url}{mark}{key}={value}")
    }
}

fn scheme_of(url: &str) -> &str {
    url.split_once("://")
        .or_else(|| url.split_once(':'))
        .map_or(url, |(s, _)| s)
}

fn decode(s: &str) -> Option<String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

fn encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, QUERY_VALUE).to_string()
}

/// What must be escaped in a query key or value: controls, space and the query's own syntax.
const QUERY_VALUE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'&')
    .add(b'=')
    .add(b'?')
    .add(b'<')
    .add(b'>');

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn durations_in_every_form_a_user_writes() {
        let s = Duration::from_secs;
        assert_eq!(parse_duration("30").unwrap(), s(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1m30s").unwrap(), s(90));
        assert_eq!(parse_duration("1m 30s").unwrap(), s(90));
        assert_eq!(parse_duration(" 1h ").unwrap(), s(3600));
        assert_eq!(parse_duration("7d").unwrap(), s(7 * 86400));
        assert_eq!(parse_duration("2days").unwrap(), s(2 * 86400));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        for bad in ["", "soon", "-5s", "5 parsecs", "99999999999999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_and_booleans() {
        assert_eq!(parse_size("1048576").unwrap(), 1 << 20);
        assert_eq!(parse_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_size("16 MiB").unwrap(), 16 << 20);
        assert_eq!(parse_size("2kB").unwrap(), 2000);
        assert!(parse_size("18446744073709551615GiB").is_err(), "overflow");
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_bool("Yes").unwrap());
        assert!(!parse_bool("0").unwrap());
        assert!(parse_bool("maybe").is_err());
    }

    #[test]
    fn query_options_refuse_unknown_and_twice_given_keys_naming_the_scheme() {
        let known = ["ack_timeout", "topic"];
        let (base, q) = QueryOptions::from_url(
            Role::Sink,
            "mqtt://h:1883?ack_timeout=1h&topic=a/%2B/c",
            &known,
        )
        .unwrap();
        assert_eq!(base, "mqtt://h:1883");
        assert_eq!(
            q.duration("ack_timeout", Bounds::TIMEOUT).unwrap(),
            Some(Duration::from_secs(3600))
        );
        assert_eq!(q.str("topic"), Some("a/+/c"));
        let e = QueryOptions::from_url(Role::Sink, "nats://h?ack_timout=1s", &known)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "sink option `ack_timout` is not known for nats:// (known: ack_timeout, topic)"
        );
        let e = QueryOptions::from_url(Role::Source, "redis://h?topic=a&topic=b", &known)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "source option `topic` is given twice in a redis:// URL");
    }

    #[test]
    fn a_bad_value_names_the_option_and_what_was_expected_but_never_a_secret() {
        let (_, q) = QueryOptions::from_url(
            Role::Sink,
            "kafka://h?ack_timeout=2d&password=hunter2&n=7",
            &["ack_timeout", "password", "n"],
        )
        .unwrap();
        assert_eq!(
            q.duration("ack_timeout", Bounds::TIMEOUT)
                .unwrap_err()
                .to_string(),
            "sink option ack_timeout=`2d`: expected at most 1day"
        );
        let e = q
            .int("password", Bounds::new(0u32, 10))
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
        assert_eq!(
            q.int("n", Bounds::new(1u32, 5)).unwrap_err().to_string(),
            "sink option n=`7`: expected at most 5"
        );
    }

    #[test]
    fn defaults_are_added_only_when_missing() {
        assert_eq!(with_default("nats://h", '?', "a", "1"), "nats://h?a=1");
        assert_eq!(
            with_default("nats://h?b=2", '?', "a", "1"),
            "nats://h?b=2&a=1"
        );
        assert_eq!(with_default("nats://h?a=9", '?', "a", "1"), "nats://h?a=9");
        assert_eq!(
            with_default("https://h/x#s=1", '#', "a", "1"),
            "https://h/x#s=1&a=1"
        );
    }

    proptest! {
        /// Whatever `humantime` writes (as the relay itself writes durations), and any whole
        /// number of seconds, parses back to the same duration.
        #[test]
        fn durations_written_by_humantime_or_as_seconds_parse_back(secs in 0u64..10_000_000, ms in 0u32..1000) {
            let d = Duration::from_secs(secs) + Duration::from_millis(u64::from(ms));
            let written = humantime::format_duration(d).to_string();
            prop_assert_eq!(parse_duration(&written).unwrap(), d);
            prop_assert_eq!(parse_duration(&secs.to_string()).unwrap(), Duration::from_secs(secs));
        }

        /// A size with any unit parses to the number times the unit, or is refused on
        /// overflow, never wrapped.
        #[test]
        fn sizes_never_wrap(n in any::<u64>(), unit in prop::sample::select(vec![("", 1u64), ("KiB", 1 << 10), ("MB", 1_000_000), ("GiB", 1 << 30)])) {
            let got = parse_size(&format!("{n}{}", unit.0));
            prop_assert_eq!(got.ok(), n.checked_mul(unit.1));
        }

        /// Any value, forwarded (encoded again) and parsed anew, comes back unchanged.
        #[test]
        fn forwarded_options_parse_back_unchanged(value in "\\PC{0,40}") {
            let known = ["v"];
            let q = QueryOptions::parse(Role::Sink, "x", &format!("v={}", encode(&value)), &known).unwrap();
            prop_assert_eq!(q.str("v"), Some(value.as_str()));
            let again = QueryOptions::parse(Role::Source, "x", &q.forward(&known), &known).unwrap();
            prop_assert_eq!(again.str("v"), Some(value.as_str()));
        }

        /// Every duration out of bounds is refused with the bound in the text, every one within
        /// accepted.
        #[test]
        fn bounds_hold(secs in 0u64..200_000) {
            let (_, q) = QueryOptions::from_url(Role::Source, &format!("x://h?t={secs}s"), &["t"]).unwrap();
            let got = q.duration("t", Bounds::TIMEOUT);
            if secs == 0 || secs > 86_400 {
                prop_assert!(got.is_err());
            } else {
                prop_assert_eq!(got.unwrap(), Some(Duration::from_secs(secs)));
            }
        }
    }
}
