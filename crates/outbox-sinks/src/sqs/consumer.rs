//! What a consumer of an SQS queue needs beside the sink (the `verify` reader, the inbox
//! source): a queue's URL from its name or URL, a message's headers, and failed calls as
//! [`outbox_core::Error`]s of the right kind.

use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::Message;
use outbox_core::{Error, ErrorKind};

use super::service::QueueRef;
use crate::aws::attributes::unpack;
use crate::aws::error::{call_failure, Class};

/// A failed call of a consumer as an error: an outage (no answer, the service's own trouble)
/// is `Connection`, to be waited out; a missing queue, a refused parameter or a refusal
/// (credentials, permissions) is `Config`, which no retry fixes.
pub fn call_error<E>(what: &str, err: &SdkError<E, HttpResponse>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let f = call_failure(err);
    let kind = match f.class {
        Class::Outage => ErrorKind::Connection,
        Class::Missing | Class::Content | Class::Refused => ErrorKind::Config,
    };
    Error::new(
        kind,
        outbox_core::redact::sanitize(&format!("sqs: {what}: {}", f.text)),
    )
}

/// The URL of the queue `queue` names: a URL as it is, a name through `GetQueueUrl`. A queue
/// that does not exist is a config error naming it and the region.
pub async fn queue_url(
    client: &aws_sdk_sqs::Client,
    queue: &QueueRef,
    region: &str,
) -> Result<String, Error> {
    let name = match queue {
        QueueRef::Url(url) => return Ok(url.clone()),
        QueueRef::Name(name) => name,
    };
    let out = client
        .get_queue_url()
        .queue_name(name)
        .send()
        .await
        .map_err(|e| {
            if call_failure(&e).class == Class::Missing {
                Error::config(format!(
                    "sqs: no queue named `{name}` in {region} for these credentials; create it \
                     first (the source does not create queues)"
                ))
            } else {
                call_error(&format!("GetQueueUrl for `{name}`"), &e)
            }
        })?;
    out.queue_url()
        .map(str::to_string)
        .ok_or_else(|| Error::config(format!("sqs: GetQueueUrl for `{name}` returned no URL")))
}

/// The headers of `m` as the sink sent them: its `String` message attributes, with
/// [`super::PACKED_HEADERS`] unpacked into one header each, sorted by name.
pub fn message_headers(m: &Message) -> Vec<(String, String)> {
    let mut attrs: Vec<(String, String)> = m
        .message_attributes()
        .map(|a| {
            a.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.string_value()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    attrs.sort();
    unpack(attrs)
}
