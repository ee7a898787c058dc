//! [`HttpSink`]: POSTs messages to a webhook endpoint, one per request or a batch per request,
//! signed per Standard Webhooks; a 2xx response is the acknowledgement.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt as _;
use outbox_core::sink::HEADER_MESSAGE_ID;
use outbox_core::{Envelope, Error, Sink, SinkError};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use serde::Serialize;
use serde_json::value::RawValue;

use super::config::{HttpConfig, Mode, DESTINATION_PLACEHOLDER};
use super::error::{response_error, transport_error};
use super::sign;

/// The header naming the rendered destination, in `mode=single`.
pub const HEADER_DESTINATION: &str = "outbox-destination";

/// Webhook sink. Per request: a 2xx is success; 408, 429, 5xx, timeouts and connection errors
/// are `unavailable` (the relay retries, no sooner than a `Retry-After` says); 413 is `invalid`;
/// any other answer is `rejected`. Redirects are not followed (a POST must not turn into a GET
/// somewhere else): they are `rejected`, naming where they point.
///
/// At most `max_in_flight` requests are in flight at once across every call (the relay's
/// workers, and the several calls each keeps out, share one sink).
pub struct HttpSink {
    cfg: Arc<HttpConfig>,
    client: reqwest::Client,
    slots: Arc<tokio::sync::Semaphore>,
}

impl HttpSink {
    /// A sink for `cfg`; connects lazily, so an endpoint that is down at start is an outage.
    pub fn connect(cfg: HttpConfig) -> Result<Self, Error> {
        let mut builder = reqwest::Client::builder()
            .timeout(cfg.ack_timeout)
            .connect_timeout(cfg.ack_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(cfg.max_in_flight)
            .user_agent(concat!("outbox/", env!("CARGO_PKG_VERSION")));
        let shown = outbox_core::redact::url(&cfg.endpoint);
        let bad = |what: &str, e: reqwest::Error| {
            Error::config(format!("http sink {shown}: {what}: {e}"))
        };
        if let Some(ca) = cfg.tls.ca_pem(&shown)? {
            let certs = reqwest::Certificate::from_pem_bundle(&ca)
                .map_err(|e| bad("tls_ca holds no usable certificate", e))?;
            builder = builder.tls_certs_only(certs);
        }
        if let Some((cert, key)) = cfg.tls.client_pem(&shown)? {
            let mut pem = cert;
            pem.extend_from_slice(b"\n");
            pem.extend_from_slice(key.expose().as_bytes());
            let identity = reqwest::Identity::from_pem(&pem).map_err(|_| {
                Error::config(format!(
                    "http sink {shown}: tls_cert and tls_key are not a certificate and its key"
                ))
            })?;
            builder = builder.identity(identity);
        }
        let client = builder
            .build()
            .map_err(|e| Error::config(format!("http sink: cannot build the client: {e}")))?;
        Ok(Self {
            slots: Arc::new(tokio::sync::Semaphore::new(cfg.max_in_flight.max(1))),
            cfg: Arc::new(cfg),
            client,
        })
    }

    /// The endpoint for `destination`: its `{destination}` replaced by the destination,
    /// percent-encoded (a `/` in it stays a path separator).
    fn url(&self, destination: &str) -> String {
        if !self.cfg.endpoint.contains(DESTINATION_PLACEHOLDER) {
            return self.cfg.endpoint.clone();
        }
        let encoded: Vec<String> = destination
            .split('/')
            .map(|seg| percent_encoding::utf8_percent_encode(seg, SEGMENT).to_string())
            .collect();
        self.cfg
            .endpoint
            .replace(DESTINATION_PLACEHOLDER, &encoded.join("/"))
    }

    /// One POST: `headers` and the signature over `body` as `id`; `Ok` on a 2xx.
    ///
    /// It must end by `deadline` (the call's): a request not yet sent by then is not sent (no
    /// duplicate), one in flight gets only the time left.
    async fn post(
        &self,
        url: String,
        id: &str,
        mut headers: HeaderMap,
        body: Bytes,
        deadline: Instant,
    ) -> Result<(), SinkError> {
        let not_sent = || {
            SinkError::unavailable(format!(
                "http: not sent: the call's ack_timeout ({:?}) ran out before its turn (raise \
                 max_in_flight or ack_timeout for a slow endpoint)",
                self.cfg.ack_timeout
            ))
        };
        // A request slot, shared with every other call in flight on this sink.
        let _slot = match tokio::time::timeout_at(deadline.into(), self.slots.acquire()).await {
            Ok(Ok(slot)) => slot,
            _ => return Err(not_sent()),
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(not_sent());
        }
        // A CloudEvents envelope brought its own (`application/cloudevents+json` when structured).
        if !headers.contains_key(CONTENT_TYPE) {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        if let Some(key) = &self.cfg.signing_key {
            let now = chrono::Utc::now().timestamp();
            let sig = sign::signature(key.bytes(), id, now, &body);
            headers.insert(sign::HEADER_ID, value(id)?);
            headers.insert(sign::HEADER_TIMESTAMP, value(&now.to_string())?);
            headers.insert(sign::HEADER_SIGNATURE, value(&sig)?);
        } else {
            headers.insert(sign::HEADER_ID, value(id)?);
        }
        let mut req = self
            .client
            .post(&url)
            .headers(headers)
            .body(body)
            .timeout(left);
        if let Some((user, pass)) = &self.cfg.basic_auth {
            req = req.basic_auth(user, Some(pass.expose()));
        }
        let shown = outbox_core::redact::url(&url);
        let resp = req.send().await.map_err(|e| transport_error(&shown, &e))?;
        let status = resp.status();
        if status.is_success() {
            // Read the body so the connection goes back to the pool.
            let _ = resp.bytes().await;
            return Ok(());
        }
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = resp.bytes().await.unwrap_or_default();
        Err(response_error(
            &shown,
            status,
            retry_after,
            location.as_deref(),
            &body,
        ))
    }

    /// `mode=single`: the payload as the body, the message's headers as HTTP headers.
    async fn post_one(&self, e: &Envelope, deadline: Instant) -> Result<(), SinkError> {
        let mut headers = HeaderMap::new();
        for (k, v) in &e.headers {
            let name = HeaderName::from_bytes(k.as_bytes()).map_err(|_| {
                SinkError::invalid(format!("header `{k}` is not a valid HTTP header name"))
            })?;
            let v = HeaderValue::from_str(v).map_err(|_| {
                SinkError::invalid(format!("the value of header `{k}` is not valid in HTTP"))
            })?;
            headers.append(name, v);
        }
        if !e.headers.iter().any(|(k, _)| k == HEADER_MESSAGE_ID) {
            headers.insert(HEADER_MESSAGE_ID, value(&e.id.to_string())?);
        }
        headers.insert(HEADER_DESTINATION, value(&e.destination)?);
        self.post(
            self.url(&e.destination),
            &e.id.to_string(),
            headers,
            e.payload.clone(),
            deadline,
        )
        .await
    }
}

/// Characters of a destination path segment that are percent-encoded.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn value(v: &str) -> Result<HeaderValue, SinkError> {
    HeaderValue::from_str(v)
        .map_err(|_| SinkError::invalid(format!("`{v}` cannot be an HTTP header value")))
}

/// A `Retry-After` value: seconds, or an HTTP date.
pub(crate) fn parse_retry_after(v: &str) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = chrono::DateTime::parse_from_rfc2822(v).ok()?;
    let wait = at.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(wait.to_std().unwrap_or(Duration::ZERO))
}

/// One message of a `mode=batch` body.
#[derive(Serialize)]
struct Item<'a> {
    id: String,
    destination: &'a str,
    key: &'a str,
    headers: std::collections::BTreeMap<&'a str, &'a str>,
    payload: &'a RawValue,
}

#[async_trait]
impl Sink for HttpSink {
    fn name(&self) -> &str {
        "http"
    }

    fn ack_timeout(&self) -> Option<Duration> {
        Some(self.cfg.ack_timeout)
    }

    /// The whole call ends within `ack_timeout` (see `post`).
    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        let deadline = Instant::now() + self.cfg.ack_timeout;
        match self.cfg.mode {
            Mode::Single => {
                // The futures are made first: a closure inside the stream trips the compiler's
                // higher-ranked lifetime check under `async_trait`.
                let calls: Vec<_> = batch
                    .iter()
                    .enumerate()
                    .map(|(i, e)| async move { (i, self.post_one(e, deadline).await) })
                    .collect();
                let mut out: Vec<(usize, Result<(), SinkError>)> = futures::stream::iter(calls)
                    .buffer_unordered(self.cfg.max_in_flight)
                    .collect()
                    .await;
                out.sort_by_key(|(i, _)| *i);
                out.into_iter().map(|(_, r)| r).collect()
            }
            Mode::Batch => self.publish_batches(batch, deadline).await,
        }
    }
}

impl HttpSink {
    /// `mode=batch`: one JSON array per endpoint and `max_batch` messages; every message of a
    /// request shares its outcome. A message whose payload is not JSON is `invalid` on its own.
    async fn publish_batches(
        &self,
        batch: &[Envelope],
        deadline: Instant,
    ) -> Vec<Result<(), SinkError>> {
        let mut results: Vec<Option<Result<(), SinkError>>> = vec![None; batch.len()];
        // Requests: (url, indexes), in the order of the call.
        let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
        let mut items: Vec<Option<Box<RawValue>>> = Vec::with_capacity(batch.len());
        for (i, e) in batch.iter().enumerate() {
            let raw = std::str::from_utf8(&e.payload)
                .ok()
                .and_then(|s| RawValue::from_string(s.to_string()).ok());
            if raw.is_none() {
                results[i] = Some(Err(SinkError::invalid(
                    "mode=batch carries payloads as JSON, and this payload is not JSON",
                )));
            }
            items.push(raw);
            if results[i].is_some() {
                continue;
            }
            let url = self.url(&e.destination);
            match groups
                .iter_mut()
                .rev()
                .find(|(u, idx)| *u == url && idx.len() < self.cfg.max_batch)
            {
                Some((_, idx)) => idx.push(i),
                None => groups.push((url, vec![i])),
            }
        }
        let requests: Vec<_> = groups
            .into_iter()
            .map(|(url, idx)| {
                let body: Result<Vec<u8>, SinkError> = idx
                    .iter()
                    .map(|&i| {
                        let e = &batch[i];
                        Ok(Item {
                            id: e.id.to_string(),
                            destination: &e.destination,
                            key: &e.key,
                            headers: e.header_map(),
                            payload: items[i]
                                .as_deref()
                                .ok_or_else(|| SinkError::invalid("payload is not JSON"))?,
                        })
                    })
                    .collect::<Result<Vec<Item>, SinkError>>()
                    .and_then(|v| {
                        serde_json::to_vec(&v).map_err(|e| {
                            SinkError::invalid(format!("cannot encode the batch as JSON: {e}"))
                        })
                    });
                // The batch's id is its first message's: each item carries its own id to dedupe on.
                let id = batch[idx[0]].id.to_string();
                async move {
                    let r = match body {
                        Ok(body) => {
                            self.post(url, &id, HeaderMap::new(), body.into(), deadline)
                                .await
                        }
                        Err(e) => Err(e),
                    };
                    (idx, r)
                }
            })
            .collect();
        let done: Vec<(Vec<usize>, Result<(), SinkError>)> = futures::stream::iter(requests)
            .buffer_unordered(self.cfg.max_in_flight)
            .collect()
            .await;
        for (idx, r) in done {
            for i in idx {
                results[i] = Some(r.clone());
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(SinkError::unavailable("no request was made"))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn envelope(n: usize) -> Envelope {
        Envelope {
            id: uuid::Uuid::now_v7(),
            destination: "d".into(),
            key: format!("k{n}"),
            headers: vec![],
            payload: Bytes::from_static(b"{}"),
            created_at: chrono::Utc::now(),
        }
    }

    /// An endpoint that takes connections and never answers: the call ends at its ack timeout,
    /// the request in flight is `unavailable` (no response in time), and those whose turn never
    /// came are not sent at all.
    /// An endpoint that takes connections, keeps them open and never answers: its address,
    /// how many connections it took, and its task.
    async fn silent_endpoint() -> (
        std::net::SocketAddr,
        Arc<std::sync::atomic::AtomicUsize>,
        tokio::task::JoinHandle<()>,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                open.push(conn); // kept open, never answered
            }
        });
        (addr, accepted, held)
    }

    #[tokio::test]
    async fn a_call_ends_within_its_ack_timeout_and_sends_nothing_after_it() {
        let (addr, accepted, held) = silent_endpoint().await;
        let sink = HttpSink::connect(
            HttpConfig::from_url(&format!(
                "http://{addr}/hook#ack_timeout=300ms&max_in_flight=1"
            ))
            .unwrap(),
        )
        .unwrap();
        let started = Instant::now();
        let results = sink.publish(&[envelope(0), envelope(1), envelope(2)]).await;
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        let errors: Vec<SinkError> = results.into_iter().map(|r| r.unwrap_err()).collect();
        assert!(errors
            .iter()
            .all(|e| e.kind == outbox_core::SinkErrorKind::Unavailable));
        assert!(
            errors[0].message.contains("no response in time"),
            "{}",
            errors[0].message
        );
        for e in &errors[1..] {
            assert!(e.message.contains("not sent"), "{}", e.message);
        }
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "one request sent"
        );
        held.abort();
    }

    /// `max_in_flight` bounds the sink, not one call: the relay keeps several calls out per
    /// worker, and together they never hold more requests than that. Checked while the first
    /// two requests are held by a silent endpoint, half-way through the calls' ack timeout:
    /// exactly two were sent. (At the deadline a slot freed by a timed-out request may still
    /// send a third request with the little time its own call has left: never more than two at
    /// once, which is the bound; counting afterwards would count that one too.)
    #[tokio::test]
    async fn calls_in_flight_together_share_max_in_flight() {
        let (addr, accepted, held) = silent_endpoint().await;
        let sink = HttpSink::connect(
            HttpConfig::from_url(&format!(
                "http://{addr}/hook#ack_timeout=4s&max_in_flight=2"
            ))
            .unwrap(),
        )
        .unwrap();
        let calls: Vec<Vec<Envelope>> = (0..3)
            .map(|c| (0..3).map(|i| envelope(c * 3 + i)).collect())
            .collect();
        let publishing = futures::future::join_all(calls.iter().map(|c| sink.publish(c)));
        let watch = async {
            // Two requests reach the endpoint (at once, on an idle machine)...
            let until = Instant::now() + Duration::from_secs(2);
            while accepted.load(std::sync::atomic::Ordering::Relaxed) < 2 {
                assert!(Instant::now() < until, "two requests were never sent");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // ...and while they are held, no third one goes out.
            tokio::time::sleep(Duration::from_millis(500)).await;
            accepted.load(std::sync::atomic::Ordering::Relaxed)
        };
        let (answers, sent_while_held) = tokio::join!(publishing, watch);
        assert_eq!(
            sent_while_held, 2,
            "two requests sent of the nine the three calls held"
        );
        assert!(answers
            .iter()
            .flatten()
            .all(|r| r.as_ref().is_err_and(|e| e.is_unavailable())));
        held.abort();
    }

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        assert_eq!(parse_retry_after("7"), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(Duration::ZERO)
        );
        let later = (chrono::Utc::now() + chrono::Duration::seconds(90)).to_rfc2822();
        let d = parse_retry_after(&later).expect("a date");
        assert!(
            d > Duration::from_secs(80) && d <= Duration::from_secs(90),
            "{d:?}"
        );
        assert_eq!(parse_retry_after("soon"), None);
    }
}
