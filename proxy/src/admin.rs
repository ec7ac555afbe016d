//! The admin listener: `/metrics` (Prometheus text), `/lanes` (each live
//! lane's snapshot as JSON, pause causes included) and `/healthz`.
//!
//! It is a listener of its own so that a firewall can keep it from the
//! proxy's clients: the lanes name tenants and vendors.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use callshaper::Shaper;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;

/// Buckets, not the exporter's default summaries, for the wait histogram:
/// buckets add up across a fleet, so its p50 and p99 are the fleet's.
const WAIT_BUCKETS: [f64; 10] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// The process's metrics recorder, installed before the shaper is built
/// (its lanes register their series as they start).
pub(crate) fn install_recorder() -> Result<PrometheusHandle, String> {
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("callshaper_wait_seconds".to_owned()),
            &WAIT_BUCKETS,
        )
        .map_err(|e| format!("metrics: {e}"))?
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| format!("metrics: {e}"))?;
    Ok(handle)
}

/// Serve the admin endpoints until the process stops.
pub(crate) async fn serve(listener: TcpListener, shaper: Shaper, metrics: PrometheusHandle) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "callshaper-proxy: admin accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (shaper, metrics) = (shaper.clone(), metrics.clone());
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let answer = answer(&shaper, &metrics, &request);
                async move { Ok::<_, Infallible>(answer) }
            });
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn answer<B>(
    shaper: &Shaper,
    metrics: &PrometheusHandle,
    request: &Request<B>,
) -> Response<Full<Bytes>> {
    let path = request.uri().path();
    if !matches!(path, "/metrics" | "/lanes" | "/healthz") {
        let body = r#"{"error":"not_found","endpoints":["/metrics","/lanes","/healthz"]}"#;
        return respond(StatusCode::NOT_FOUND, "application/json", body.into());
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = respond(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
        response
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match path {
        "/metrics" => respond(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            metrics.render().into(),
        ),
        "/lanes" => match serde_json::to_vec(&shaper.lanes()) {
            Ok(json) => respond(StatusCode::OK, "application/json", json.into()),
            // Only a custom meter's lane cannot be written as data.
            Err(error) => respond(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                format!("{error}\n").into(),
            ),
        },
        _ => {
            let body = format!(r#"{{"status":"ok","lanes":{}}}"#, shaper.live_lanes());
            respond(StatusCode::OK, "application/json", body.into())
        }
    }
}

fn respond(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response
}
