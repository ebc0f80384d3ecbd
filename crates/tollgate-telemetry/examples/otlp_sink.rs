//! An OTLP/HTTP trace receiver that accepts and discards every export, for
//! measuring what exporting costs the exporter (benches/gateway/run.sh,
//! path `gateway-otel`). Counts requests and bytes; `GET /stats` answers
//! them as JSON.
//!
//!   cargo run --release -p tollgate-telemetry --example otlp_sink -- 127.0.0.1:4318

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::{get, post};

#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    bytes: AtomicU64,
}

async fn receive(
    State(counts): State<Arc<Counts>>,
    body: Bytes,
) -> ([(&'static str, &'static str); 1], Vec<u8>) {
    counts.requests.fetch_add(1, Ordering::Relaxed);
    counts.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
    // An empty ExportTraceServiceResponse: every span accepted.
    ([("content-type", "application/x-protobuf")], Vec::new())
}

async fn stats(State(counts): State<Arc<Counts>>) -> String {
    format!(
        "{{\"requests\": {}, \"bytes\": {}}}\n",
        counts.requests.load(Ordering::Relaxed),
        counts.bytes.load(Ordering::Relaxed)
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:4318".to_owned());
    let counts = Arc::new(Counts::default());
    let app = Router::new()
        .route("/v1/traces", post(receive))
        .route("/stats", get(stats))
        .with_state(counts);
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("otlp_sink: discarding OTLP/HTTP traces on http://{addr}");
    axum::serve(listener, app).await
}
