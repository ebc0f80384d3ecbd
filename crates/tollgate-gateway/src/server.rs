//! The HTTP server: bounded connections and a graceful shutdown (SPEC
//! GW-7, GW-8).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use crate::routes;
use crate::state::AppState;

/// Connection bounds and shutdown timing.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// Largest request head (request line and headers); at least 8 KiB.
    pub max_header_bytes: usize,
    /// Time a client has to send a request head.
    pub header_read_timeout: Duration,
    /// Time a keep-alive connection may stay idle between requests.
    ///
    /// hyper runs one timer from the moment a connection waits for a
    /// request head (idle keep-alive included) until the head is complete,
    /// so that timer is set to the smaller of this and
    /// `header_read_timeout`: each is an upper bound.
    pub idle_timeout: Duration,
    /// Time active calls get to finish after a shutdown signal.
    pub shutdown_grace: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_header_bytes: 16 * 1024,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// hyper refuses a smaller read buffer.
const MIN_BUF: usize = 8 * 1024;

/// Serves `app` on `listener` until `shutdown` resolves, then shuts down
/// gracefully (SPEC GW-8): stop accepting, refuse new requests and abort
/// queued ones with 503, let active calls finish within the grace period,
/// then cancel what is left and close.
pub async fn serve(
    listener: TcpListener,
    app: Arc<AppState>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let router = routes::router(Arc::clone(&app));
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout.min(options.idle_timeout))
        .max_buf_size(options.max_header_bytes.max(MIN_BUF))
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _peer) = match accepted {
                    Ok(a) => a,
                    // Out of file descriptors and the like: keep serving.
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let service = TowerToHyperService::new(router.clone());
                let conn = http.serve_connection(TokioIo::new(stream), service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    tracing::info!(
        grace_s = options.shutdown_grace.as_secs_f64(),
        "shutting down"
    );
    app.begin_shutdown();
    let drained = tokio::time::timeout(options.shutdown_grace, graceful.shutdown()).await;
    if drained.is_err() {
        tracing::warn!("grace period over: cancelling the calls still running");
    }
    // Cancels whatever still runs (streams end with an error event) and
    // waits until every permit is back.
    app.upstream.close().await;
    app.tenants.close().await;
    Ok(())
}

/// Binds `addr`.
pub async fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Resolves on SIGINT or SIGTERM.
pub async fn signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
