//! The HTTP server: `GET /metrics`, `/livez` and `/readyz` on one address (hyper, HTTP/1.1).
//! Bind it to loopback unless the probes must be reached from elsewhere (a Kubernetes kubelet
//! reaches the pod's address: bind `0.0.0.0:9464` there).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use outbox_relay::Verdict;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::exporter::Exporter;
use crate::target::Target;

/// The exposition format's content type.
const METRICS_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// How often the histograms' recent observations are folded into their buckets.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Binds `addr` for [`serve`] (port 0 picks a free one: see [`Server::local_addr`]).
pub async fn bind(addr: SocketAddr) -> std::io::Result<Server> {
    let listener = TcpListener::bind(addr).await?;
    Ok(Server { listener })
}

/// A bound, not yet serving, listener.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
}

impl Server {
    /// The address it listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// Serves `target` on `server` until `shutdown`: `/metrics` (collects the scrape-time figures,
/// then renders `exporter`), `/livez` and `/readyz` (200 when the probe passes, 503 with the
/// failing checks first otherwise; one line per check either way). Anything else is a 404;
/// methods other than GET and HEAD a 405.
pub async fn serve(
    server: Server,
    exporter: Exporter,
    target: Arc<Target>,
    shutdown: CancellationToken,
) {
    let addr = server
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    info!(addr = %addr, "serving /metrics, /livez and /readyz");
    let upkeep = {
        let (exporter, stop) = (exporter.clone(), shutdown.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(UPKEEP_EVERY) => exporter.run_upkeep(),
                    _ = stop.cancelled() => return,
                }
            }
        })
    };
    let routes = tokio::spawn(target.clone().run_routes(shutdown.clone()));
    loop {
        let accepted = tokio::select! {
            a = server.listener.accept() => a,
            _ = shutdown.cancelled() => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors and the like: wait a moment rather than spin.
                warn!(%error, "metrics server: accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (exporter, target) = (exporter.clone(), target.clone());
        let service = hyper::service::service_fn(move |req| {
            let (exporter, target) = (exporter.clone(), target.clone());
            async move { Ok::<_, Infallible>(answer(req, &exporter, &target).await) }
        });
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(error) = r {
                        debug!(%error, "metrics server: connection ended with an error");
                    }
                }
                _ = stop.cancelled() => conn.as_mut().graceful_shutdown(),
            }
        });
    }
    upkeep.abort();
    routes.abort();
}

async fn answer(
    req: Request<Incoming>,
    exporter: &Exporter,
    target: &Target,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n".into());
    }
    match req.uri().path() {
        "/metrics" => {
            target.collect().await;
            let mut r = Response::new(Full::new(Bytes::from(exporter.render())));
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(METRICS_TYPE));
            r
        }
        "/livez" => verdict(target.live()),
        "/readyz" => verdict(target.ready().await),
        "/" => text(
            StatusCode::OK,
            "outbox: /metrics (Prometheus), /livez, /readyz\n".into(),
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /livez or /readyz\n".into(),
        ),
    }
}

fn verdict(v: Verdict) -> Response<Full<Bytes>> {
    let status = if v.ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut body = String::from(if v.ok { "ok\n" } else { "unavailable\n" });
    for line in v.lines {
        body.push_str(&line);
        body.push('\n');
    }
    text(status, body)
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
