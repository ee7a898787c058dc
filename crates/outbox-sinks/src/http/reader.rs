//! [`HttpReceiver`]: a webhook endpoint on 127.0.0.1, in process, that checks signatures and
//! records what arrives; its [`HttpReader`] is the HTTP sink's independent consumer for
//! `outbox verify`, `outbox bench` and the tests.
//!
//! It answers `204` to every request it records. While the file named by
//! `OUTBOX_HTTP_RECEIVER_DOWN_FILE` exists it answers `503` with `Retry-After: 1` (how
//! `outbox verify` takes the "broker" down), and a [`Behaviour`] may answer other requests
//! itself, as a receiving application would (a validation error, an outage).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use outbox_core::{Error, ErrorKind};
use tokio::sync::mpsc;

use super::config::HttpConfig;
use super::sign;
use crate::read::{Delivered, Polled, Reader, Scratch, ScratchOptions};

/// The environment variable naming the receiver's "down" switch (a file path).
pub const DOWN_FILE_ENV: &str = "OUTBOX_HTTP_RECEIVER_DOWN_FILE";

/// One request as a [`Behaviour`] sees it.
pub struct IncomingRequest<'a> {
    /// The path after the receiver's prefix: the destination.
    pub destination: &'a str,
    /// The request's headers, names in lower case.
    pub headers: &'a [(String, String)],
    /// The body.
    pub body: &'a [u8],
}

/// Decides a request's answer before it is recorded: `Some((status, headers))` answers with
/// that and records nothing; `None` records it and answers `204`.
pub type Behaviour =
    Arc<dyn Fn(&IncomingRequest<'_>) -> Option<(u16, Vec<(String, String)>)> + Send + Sync>;

/// Counters of a receiver.
#[derive(Debug, Default)]
pub struct ReceiverStats {
    /// Requests answered, whatever the answer.
    pub requests: AtomicUsize,
    /// Requests refused for a missing or wrong signature (answered `401`).
    pub bad_signatures: AtomicUsize,
    /// Items that were not readable as messages.
    pub unreadable: AtomicUsize,
}

/// A running receiver; stops when dropped.
pub struct HttpReceiver {
    addr: SocketAddr,
    prefix: String,
    rx: mpsc::UnboundedReceiver<Delivered>,
    stats: Arc<ReceiverStats>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HttpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Shared {
    prefix: String,
    key: Option<Vec<u8>>,
    tx: mpsc::UnboundedSender<Delivered>,
    stats: Arc<ReceiverStats>,
    behaviour: Option<Behaviour>,
    down_file: Option<std::path::PathBuf>,
}

impl HttpReceiver {
    /// Starts a receiver on `127.0.0.1` (a free port) for requests under `/<prefix>/`; with
    /// `key` (the raw signing key) it refuses requests without a valid signature.
    pub async fn start(
        prefix: &str,
        key: Option<Vec<u8>>,
        behaviour: Option<Behaviour>,
    ) -> Result<Self, Error> {
        Self::start_at(0, prefix, key, behaviour).await
    }

    /// The same on a given port of `127.0.0.1` (a receiver that comes back where it was).
    pub async fn start_at(
        port: u16,
        prefix: &str,
        key: Option<Vec<u8>>,
        behaviour: Option<Behaviour>,
    ) -> Result<Self, Error> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .map_err(|e| Error::new(ErrorKind::Connection, format!("http receiver: bind: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::new(ErrorKind::Connection, format!("http receiver: {e}")))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(ReceiverStats::default());
        let shared = Arc::new(Shared {
            prefix: format!("/{prefix}/"),
            key,
            tx,
            stats: stats.clone(),
            behaviour,
            down_file: std::env::var_os(DOWN_FILE_ENV).map(Into::into),
        });
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let shared = shared.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, std::convert::Infallible>(answer(&shared, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            addr,
            prefix: prefix.to_string(),
            rx,
            stats,
            task,
        })
    }

    /// The URL a sink posts to, with `{destination}` for the destination.
    pub fn url(&self) -> String {
        format!("http://{}/{}/{{destination}}", self.addr, self.prefix)
    }

    /// The counters.
    pub fn stats(&self) -> &ReceiverStats {
        &self.stats
    }
}

fn respond(status: u16, headers: Vec<(String, String)>) -> Response<Full<Bytes>> {
    let mut r = Response::builder().status(status);
    for (k, v) in headers {
        r = r.header(k, v);
    }
    r.body(Full::new(Bytes::new()))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

async fn answer(shared: &Shared, req: Request<Incoming>) -> Response<Full<Bytes>> {
    shared.stats.requests.fetch_add(1, Ordering::Relaxed);
    if shared.down_file.as_ref().is_some_and(|f| f.exists()) {
        return respond(503, vec![("retry-after".into(), "1".into())]);
    }
    let path = req.uri().path().to_string();
    let Some(destination) = path.strip_prefix(&shared.prefix).map(|d| {
        percent_encoding::percent_decode_str(d)
            .decode_utf8_lossy()
            .into_owned()
    }) else {
        return respond(404, vec![]);
    };
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let Ok(body) = req.into_body().collect().await.map(|b| b.to_bytes()) else {
        return respond(400, vec![]);
    };
    let find = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    if let Some(key) = &shared.key {
        let ok = match (
            find(sign::HEADER_ID),
            find(sign::HEADER_TIMESTAMP).and_then(|t| t.parse::<i64>().ok()),
            find(sign::HEADER_SIGNATURE),
        ) {
            (Some(id), Some(ts), Some(sig)) => sign::verify(key, id, ts, &body, sig),
            _ => false,
        };
        if !ok {
            shared.stats.bad_signatures.fetch_add(1, Ordering::Relaxed);
            return respond(401, vec![]);
        }
    }
    if let Some(b) = &shared.behaviour {
        let view = IncomingRequest {
            destination: &destination,
            headers: &headers,
            body: &body,
        };
        if let Some((status, h)) = b(&view) {
            return respond(status, h);
        }
    }
    if find(outbox_core::sink::HEADER_MESSAGE_ID).is_some() {
        match Delivered::from_headers(destination, headers, body) {
            Some(d) => {
                let _ = shared.tx.send(d);
            }
            None => {
                shared.stats.unreadable.fetch_add(1, Ordering::Relaxed);
            }
        }
    } else {
        // `mode=batch`: a JSON array of messages.
        let items: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap_or_default();
        if items.is_empty() {
            shared.stats.unreadable.fetch_add(1, Ordering::Relaxed);
        }
        for item in items {
            match batch_item(&item) {
                Some(d) => {
                    let _ = shared.tx.send(d);
                }
                None => {
                    shared.stats.unreadable.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    respond(204, vec![])
}

/// One item of a batch body: `id`, `destination`, `key`, `headers`, `payload`.
fn batch_item(item: &serde_json::Value) -> Option<Delivered> {
    let id = item["id"].as_str()?.parse().ok()?;
    let headers = item["headers"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default();
    Some(Delivered {
        id,
        destination: item["destination"].as_str()?.to_string(),
        key: item["key"].as_str().unwrap_or_default().to_string(),
        headers,
        payload: Bytes::from(serde_json::to_vec(&item["payload"]).ok()?),
    })
}

/// Reads what a receiver recorded, in arrival order.
pub struct HttpReader {
    receiver: HttpReceiver,
    reported_unreadable: usize,
}

impl HttpReader {
    /// A reader of `receiver`.
    pub fn new(receiver: HttpReceiver) -> Self {
        Self {
            receiver,
            reported_unreadable: 0,
        }
    }
}

#[async_trait]
impl Reader for HttpReader {
    async fn poll(&mut self, wait: Duration) -> Polled {
        let mut out = Polled::default();
        if let Ok(Some(first)) = tokio::time::timeout(wait, self.receiver.rx.recv()).await {
            out.delivered.push(first);
            while let Ok(d) = self.receiver.rx.try_recv() {
                out.delivered.push(d);
            }
        }
        let s = self.receiver.stats();
        let bad = s.unreadable.load(Ordering::Relaxed) + s.bad_signatures.load(Ordering::Relaxed);
        out.unreadable = bad - self.reported_unreadable;
        self.reported_unreadable = bad;
        out
    }

    fn describe(&self) -> String {
        format!("webhook receiver {}", self.receiver.url())
    }

    async fn cleanup(&mut self) {}
}

/// A receiver of its own for a run: whatever host `url` names, `outbox verify` and `outbox
/// bench` post to a receiver they run on 127.0.0.1 (they must read back what arrives). The
/// URL's options after `#` (mode, secret, …) are kept, and the receiver checks signatures with
/// the same secret.
pub(crate) async fn scratch(url: &str, options: &ScratchOptions) -> Result<Scratch, Error> {
    let cfg = HttpConfig::from_url(url)?;
    let key = cfg.signing_key.as_ref().map(|k| k.bytes().to_vec());
    let prefix = options.unique_name();
    let receiver = HttpReceiver::start(&prefix, key, None).await?;
    let fragment = url.split_once('#').map(|(_, f)| f).unwrap_or("");
    let sink_url = if fragment.is_empty() {
        receiver.url()
    } else {
        format!("{}#{fragment}", receiver.url())
    };
    Ok(Scratch {
        sink_url,
        destination: prefix,
        reader: Box::new(HttpReader::new(receiver)),
    })
}
