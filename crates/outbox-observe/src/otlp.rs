//! `--otlp-endpoint`: spans exported over OTLP/HTTP (protobuf) to a collector (the
//! OpenTelemetry Collector, Jaeger, Tempo, …), through the SDK's batch processor and the
//! reqwest client already in the binary.
//!
//! [`install`] sets the process's global tracer provider and turns the relay's and the inbox's
//! spans on; [`Tracing::shutdown`] flushes what is still queued. Export failures (a collector
//! that is down) are the SDK's to report and never slow or fail publishing: spans are queued and
//! dropped when the queue is full.

use std::time::Duration;

use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;

/// Links a span may carry: a publish span links every message of its batch.
const MAX_LINKS: u32 = 10_000;
/// Longest one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why tracing could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("--otlp-endpoint {endpoint}: {reason}")]
pub struct OtlpError {
    endpoint: String,
    reason: String,
}

/// The installed exporter: call [`Tracing::shutdown`] before the process ends.
#[derive(Debug)]
pub struct Tracing {
    provider: SdkTracerProvider,
}

impl Tracing {
    /// Exports the spans still queued (waits up to the export timeout), then stops.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown_with_timeout(EXPORT_TIMEOUT) {
            tracing::warn!(error = %e, "otlp: spans still queued at shutdown may be lost");
        }
    }
}

/// The traces URL of `endpoint`: a collector's base URL (`http://host:4318`) gets the OTLP
/// path `/v1/traces`, as `OTEL_EXPORTER_OTLP_ENDPOINT` does; a URL with a path is kept.
pub fn traces_url(endpoint: &str) -> Result<String, String> {
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .ok_or("the endpoint must be an http:// or https:// URL (OTLP over HTTP, port 4318)")?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err("the endpoint names no host".into());
    }
    Ok(match rest.find('/') {
        Some(i) if rest[i..].len() > 1 => endpoint.to_string(),
        _ => format!("{}/v1/traces", endpoint.trim_end_matches('/')),
    })
}

/// Sets up span export to `endpoint` for `service` (`outbox-relay`, `outbox-inbox`) and turns
/// the relay's and the inbox's spans on. Call inside the tokio runtime: exports run on it.
pub fn install(endpoint: &str, service: &'static str) -> Result<Tracing, OtlpError> {
    let fail = |reason: String| OtlpError {
        endpoint: outbox_core::redact::url(endpoint),
        reason,
    };
    let url = traces_url(endpoint).map_err(fail)?;
    let client = Client {
        http: reqwest::Client::builder()
            .timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| fail(e.to_string()))?,
        runtime: tokio::runtime::Handle::try_current()
            .map_err(|_| fail("no async runtime to export on".into()))?,
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| fail(e.to_string()))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_max_links_per_span(MAX_LINKS)
        .with_resource(Resource::builder().with_service_name(service).build())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    outbox_relay::spans::enable();
    outbox_inbox::spans::enable();
    Ok(Tracing { provider })
}

/// The exporter's HTTP client: reqwest on the process's tokio runtime. The SDK's batch
/// processor exports from a thread of its own, outside the runtime, so each request is spawned
/// onto the runtime and awaited from there.
#[derive(Debug)]
struct Client {
    http: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Client {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<bytes::Bytes>,
    ) -> Result<opentelemetry_http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let call = self
            .http
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body);
        let answer = self
            .runtime
            .spawn(async move {
                let r = call.send().await?;
                let status = r.status();
                let body = r.bytes().await?;
                Ok::<_, reqwest::Error>((status, body))
            })
            .await??;
        let mut response = opentelemetry_http::Response::new(answer.1);
        *response.status_mut() = answer.0;
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_url_gets_the_traces_path_and_a_full_one_is_kept() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").as_deref(),
            Ok("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(
            traces_url("http://c:4318/").as_deref(),
            Ok("http://c:4318/v1/traces")
        );
        assert_eq!(
            traces_url("https://c/otlp/v1/traces").as_deref(),
            Ok("https://c/otlp/v1/traces")
        );
        assert!(traces_url("grpc://c:4317").is_err());
        assert!(traces_url("http://").is_err());
    }
}
