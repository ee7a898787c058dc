//! Configuration of the SQS and SNS sinks: `sqs://?region=…&endpoint=…` and `sns://…`.
//!
//! The URL holds no secret: credentials come from the standard AWS chain (environment,
//! shared config and credentials files with their profiles, SSO, web identity, ECS and EC2
//! instance roles), never from the URL, so none can reach a log line or an error.

use std::time::Duration;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use outbox_core::options::{Bounds, QueryOptions, Role};
use outbox_core::Error;

/// Default bound on one publish call (lookups, batch calls and the SDK's retries included):
/// the sink's ack timeout.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long opening a TCP (and TLS) connection to the service may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The largest message, attributes included, SQS and SNS take by default: 256 KiB. SQS
/// queues may be set up to 1 MiB; the `sqs://` option `max_message_bytes` raises the sink's
/// limit to match.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 262_144;

/// The largest message any SQS queue takes (1 MiB).
pub const SQS_MAX_MESSAGE_BYTES: usize = 1_048_576;

/// Options of an `sqs://` or `sns://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsConfig {
    /// `sqs` or `sns`.
    pub service: &'static str,
    /// The region (`?region=`); when unset, the standard chain's (`AWS_REGION`, the profile).
    pub region: Option<String>,
    /// Another endpoint than AWS's (`?endpoint=http://127.0.0.1:4566` for a local emulator).
    pub endpoint: Option<String>,
    /// Longest a publish call may take, its lookups, batch calls and the SDK's own retries
    /// included (`?ack_timeout=`, 5 s by default); messages still without an answer then count
    /// as unavailable and the relay retries them.
    pub ack_timeout: Duration,
    /// Largest message the sink sends, body and attributes together (`?max_message_bytes=`,
    /// SQS only, 256 KiB by default, at most 1 MiB); a larger one is invalid before sending.
    /// A batch call carries at most this much too.
    pub max_message_bytes: usize,
}

/// Options the `sqs://` sink reads from the URL's query.
pub const SQS_OPTIONS: &[&str] = &["region", "endpoint", "ack_timeout", "max_message_bytes"];
/// Options the `sns://` sink reads from the URL's query.
pub const SNS_OPTIONS: &[&str] = &["region", "endpoint", "ack_timeout"];

impl AwsConfig {
    /// Parses `sqs://[?region=R][&endpoint=URL][&ack_timeout=5s][&max_message_bytes=N]`.
    pub fn sqs_from_url(url: &str) -> Result<Self, Error> {
        Self::from_url("sqs", url)
    }

    /// Parses `sns://[?region=R][&endpoint=URL][&ack_timeout=5s]`.
    pub fn sns_from_url(url: &str) -> Result<Self, Error> {
        Self::from_url("sns", url)
    }

    /// Parses `{service}://[?…]` with the options of `service` (`sqs` or `sns`).
    pub(crate) fn from_url(service: &'static str, url: &str) -> Result<Self, Error> {
        let shown = outbox_core::redact::url(url);
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let prefix = format!("{service}://");
        let Some(rest) = base.strip_prefix(&prefix) else {
            return Err(Error::config(format!(
                "sink `{shown}`: expected {service}://?region=…&endpoint=…"
            )));
        };
        if !rest.is_empty() {
            return Err(Error::config(format!(
                "sink `{shown}`: put nothing between `{service}://` and `?`: the {} comes from \
                 the destination template, the region and endpoint from `?region=` and \
                 `?endpoint=`, and credentials from the standard AWS chain (never the URL)",
                if service == "sqs" { "queue" } else { "topic" }
            )));
        }
        let known = if service == "sqs" {
            SQS_OPTIONS
        } else {
            SNS_OPTIONS
        };
        let o = QueryOptions::parse(Role::Sink, service, query, known)?;
        Self::from_options(service, &o)
    }

    /// The SQS (`service` "sqs") or SNS ("sns") configuration with the options `o` parsed by
    /// the caller: the inbox's SQS source takes these options beside its own, and its errors
    /// then say "source option".
    pub fn from_options(service: &'static str, o: &QueryOptions) -> Result<Self, Error> {
        let region = o.str("region");
        if let Some(r) = region {
            let ok = !r.is_empty()
                && r.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !ok {
                return Err(o.invalid("region", r, "a region such as us-east-1"));
            }
        }
        let cfg = Self {
            service,
            region: region.map(str::to_string),
            endpoint: o.str("endpoint").map(check_endpoint).transpose()?,
            ack_timeout: o
                .duration("ack_timeout", Bounds::TIMEOUT)?
                .unwrap_or(DEFAULT_ACK_TIMEOUT),
            // The queue's MaximumMessageSize ranges from 1 KiB to 1 MiB.
            max_message_bytes: o
                .int(
                    "max_message_bytes",
                    Bounds::new(1024, SQS_MAX_MESSAGE_BYTES),
                )?
                .unwrap_or(DEFAULT_MAX_MESSAGE_BYTES),
        };
        Ok(cfg)
    }

    /// The SDK configuration: this URL's region and endpoint over the standard chain, the ack
    /// timeout as the bound of each call (retries included). Resolves no credentials yet: a
    /// missing or expired credential fails the publish calls (rejected, never an outage), not
    /// the start.
    pub async fn sdk_config(&self) -> Result<SdkConfig, Error> {
        let mut loader = aws_config::defaults(BehaviorVersion::latest()).timeout_config(
            aws_config::timeout::TimeoutConfig::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .operation_timeout(self.ack_timeout)
                .build(),
        );
        if let Some(region) = &self.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(endpoint) = &self.endpoint {
            loader = loader.endpoint_url(endpoint.clone());
        }
        let sdk = loader.load().await;
        if sdk.region().is_none() {
            return Err(Error::config(format!(
                "{}: no AWS region: set ?region= on the sink URL, or AWS_REGION",
                self.service
            )));
        }
        Ok(sdk)
    }
}

impl AwsConfig {
    /// The SDK configuration for readers and tools beside the sink (scratch setup, tests):
    /// as [`AwsConfig::sdk_config`], with a call bound above SQS's longest long poll (20 s).
    pub async fn reader_sdk_config(&self) -> Result<SdkConfig, Error> {
        let mut cfg = self.clone();
        cfg.ack_timeout = READER_CALL_TIMEOUT;
        cfg.sdk_config().await
    }
}

/// Bound on a reader's calls: above the longest `ReceiveMessage` long poll.
const READER_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// An endpoint is an `http://` or `https://` URL without userinfo (credentials never travel in
/// a URL here).
fn check_endpoint(value: &str) -> Result<String, Error> {
    let rest = value
        .strip_prefix("http://")
        .or_else(|| value.strip_prefix("https://"));
    match rest {
        Some(rest) if !rest.is_empty() => {
            let authority = rest.split('/').next().unwrap_or_default();
            if authority.contains('@') {
                return Err(Error::config(
                    "sink option endpoint: credentials do not belong in the endpoint URL; they \
                     come from the standard AWS chain (AWS_ACCESS_KEY_ID, profiles, roles)",
                ));
            }
            Ok(value.to_string())
        }
        _ => Err(Error::config(format!(
            "sink option endpoint=`{}`: expected an http:// or https:// URL",
            outbox_core::redact::url(value)
        ))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_options() {
        let c = AwsConfig::sqs_from_url(
            "sqs://?region=us-east-1&endpoint=http%3A%2F%2F127.0.0.1%3A4566&ack_timeout=250ms&max_message_bytes=1048576",
        )
        .unwrap();
        assert_eq!(c.region.as_deref(), Some("us-east-1"));
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:4566"));
        assert_eq!(c.ack_timeout, Duration::from_millis(250));
        assert_eq!(c.max_message_bytes, 1_048_576);
        let d = AwsConfig::sns_from_url("sns://").unwrap();
        assert_eq!(
            (d.region, d.endpoint, d.ack_timeout, d.max_message_bytes),
            (None, None, DEFAULT_ACK_TIMEOUT, DEFAULT_MAX_MESSAGE_BYTES)
        );
        let e = AwsConfig::sns_from_url("sns://?endpoint=http://127.0.0.1:4566").unwrap();
        assert_eq!(e.endpoint.as_deref(), Some("http://127.0.0.1:4566"));
    }

    #[test]
    fn unknown_options_and_bad_values_are_config_errors_that_name_them() {
        let e = AwsConfig::sqs_from_url("sqs://?bogus=1").unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        // SNS has no per-queue size setting: its limit is 256 KiB.
        let e = AwsConfig::sns_from_url("sns://?max_message_bytes=2048").unwrap_err();
        assert!(e.to_string().contains("max_message_bytes"), "{e}");
        for bad in [
            "sqs://?region=US East",
            "sqs://?endpoint=ftp://x",
            "sqs://?ack_timeout=soon",
            "sqs://?ack_timeout=0s",
            "sqs://?max_message_bytes=10",
            "sqs://?max_message_bytes=2000000",
            "sqs://queue-name",
            "sns:topic",
        ] {
            assert!(
                AwsConfig::sqs_from_url(bad).is_err() || AwsConfig::sns_from_url(bad).is_err(),
                "{bad}"
            );
            assert!(AwsConfig::sqs_from_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn credentials_never_come_from_the_url_and_are_never_echoed() {
        let e = AwsConfig::sqs_from_url("sqs://AKIA:s3cret@?region=us-east-1").unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let e = AwsConfig::sqs_from_url("sqs://?endpoint=http://AKIA:s3cret@127.0.0.1:4566")
            .unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }
}
