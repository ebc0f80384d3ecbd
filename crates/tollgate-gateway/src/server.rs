//! The HTTP server: bounded connections and a graceful shutdown (SPEC
//! GW-7, GW-8).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tollgate::clock::Instant;
use tower::ServiceExt;

use crate::access_log;
use crate::client_cap::ClientCap;
use crate::config::ServerConfig;
use crate::connection::{self, Arrival, Connection};
use crate::live::Live;
use crate::routes;
use crate::send_timeout::SendTimeout;
use crate::state::AppState;
use crate::threads::ConnectionThreads;

/// Connection bounds and shutdown timing.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// Largest request head (request line and headers); at least 8 KiB.
    pub max_header_bytes: usize,
    /// Time a client has to send a request head.
    pub header_read_timeout: Duration,
    /// Time a keep-alive connection may stay idle between requests, and
    /// the longest a client may go without accepting a byte of a response
    /// (the send timeout, [`crate::send_timeout`]).
    ///
    /// hyper runs one timer from the moment a connection waits for a
    /// request head (idle keep-alive included) until the head is complete,
    /// so that timer is set to the smaller of this and
    /// `header_read_timeout`: each is an upper bound.
    pub idle_timeout: Duration,
    /// Client connections served at once (at least 1). The accept loop
    /// takes a slot before it accepts, so further connections wait in the
    /// listen backlog until one closes (SPEC GW-7, GW-17).
    pub max_connections: usize,
    /// `Some(n)`: a client address (IPv4 address, IPv6 /64) holds at most
    /// `n` of the API listener's connections; one more is answered 429
    /// `too_many_connections` and closed at once, its slot free again
    /// ([`crate::client_cap`], SPEC GW-17). Clamped to 1..=`max_connections`.
    pub max_connections_per_client: Option<usize>,
    /// Time active calls get to finish after a shutdown signal.
    pub shutdown_grace: Duration,
    /// After the grace period: how long closing the controllers (every
    /// permit back) may take before the remaining connections are dropped
    /// and `serve` returns anyway (SPEC GW-8).
    pub cleanup_budget: Duration,
    /// `Some(n)`: connections are served on `n` threads of their own, each
    /// a single-threaded runtime ([`ConnectionThreads`]); `None`: on the
    /// runtime `serve` runs on.
    pub connection_threads: Option<usize>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions::from_config(&ServerConfig::default())
    }
}

impl ServeOptions {
    /// The options of `[server]`, with the default cleanup budget.
    pub fn from_config(server: &ServerConfig) -> Self {
        ServeOptions {
            max_header_bytes: server.max_header_bytes,
            header_read_timeout: server.header_read_timeout,
            idle_timeout: server.idle_timeout,
            max_connections: server.max_connections,
            max_connections_per_client: server.max_connections_per_client,
            shutdown_grace: server.shutdown_grace,
            cleanup_budget: CLEANUP_BUDGET,
            connection_threads: server.connection_threads,
        }
    }
}

/// Default [`ServeOptions::cleanup_budget`].
pub const CLEANUP_BUDGET: Duration = Duration::from_secs(5);

/// hyper refuses a smaller read buffer.
const MIN_BUF: usize = 8 * 1024;

/// Serves `app` on `listener` until `shutdown` resolves, then shuts down
/// gracefully (SPEC GW-8): stop accepting, refuse new requests and abort
/// queued ones with 503, let active calls finish within the grace period,
/// then cancel what is left (every permit back, within the cleanup
/// budget), drop the remaining connections and return.
///
/// Each connection runs on a task of its own that also drops it when a
/// response registered a close instant that passed (a stream whose client
/// stopped reading, see [`crate::connection`]) or when the server gives up
/// on it after the grace period.
pub async fn serve(
    listener: TcpListener,
    app: Arc<AppState>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let live = Arc::new(Live::new(Arc::clone(&app), None, app.metrics.clone()));
    serve_live(listener, None, live, options, shutdown).await
}

/// [`serve`] for a reloadable state (SPEC GW-15), with `/metrics` on
/// `metrics` when given (OBS-2). Each request uses the state current when
/// it arrived; the shutdown covers the states a reload replaced while
/// their calls still run.
pub async fn serve_live(
    listener: TcpListener,
    metrics: Option<TcpListener>,
    live: Arc<Live>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    // First, so that a failure to start them leaves nothing running.
    let threads = options
        .connection_threads
        .map(ConnectionThreads::start)
        .transpose()?;
    let router = routes::router(Arc::clone(&live), metrics.is_none());
    // Access lines wait in a buffer at most this long (SPEC GW-14), and
    // histogram samples are folded into their buckets between scrapes.
    let flusher = {
        let live = Arc::clone(&live);
        tokio::spawn(async move {
            let mut flush = tokio::time::interval(access_log::FLUSH_EVERY);
            let mut upkeep = tokio::time::interval(crate::metrics::UPKEEP_EVERY);
            loop {
                tokio::select! {
                    _ = flush.tick() => live.current().access_log.flush(),
                    _ = upkeep.tick() => live.current().metrics.upkeep(),
                }
            }
        })
    };
    // The status page's history (SPEC OBS-6): one sample a second.
    let sampler = tokio::spawn(crate::status::sample_every(Arc::clone(&live)));
    let stop_metrics = CancellationToken::new();
    // Clamped so that `Semaphore::new` and `acquire_many` accept it.
    let cap = options
        .max_connections
        .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout.min(options.idle_timeout))
        .max_buf_size(options.max_header_bytes.max(MIN_BUF))
        .keep_alive(true);
    if let Some(listener) = metrics {
        // The same bounds as the API's listener, with slots of its own: a
        // client of one cannot take the other's (SPEC GW-7, GW-17).
        let router = routes::metrics_router(Arc::clone(&live));
        tokio::spawn(serve_side(
            listener,
            router,
            http.clone(),
            Arc::new(Semaphore::new(cap)),
            options.idle_timeout,
            stop_metrics.clone(),
        ));
    }
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(cap));
    // Not on the side listener: its slots are its own, so a flood there
    // takes no API connection, and it is meant for the operator's own
    // scrapers (docs/operations.md, "Connections").
    let per_client = options
        .max_connections_per_client
        .map(|n| ClientCap::new(n.clamp(1, cap)));
    let dropped = CancellationToken::new();
    tokio::pin!(shutdown);
    loop {
        // A slot first: past the cap, connections wait in the backlog.
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    // Out of file descriptors and the like: keep serving.
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                // A client over its cap is answered and closed without
                // its request read, and its slot is free at once: the
                // excess costs only its sender (GW-17).
                let client = match &per_client {
                    None => None,
                    Some(per_client) => match per_client.take(peer.ip()) {
                        Some(client) => Some(client),
                        None => {
                            drop(slot);
                            per_client.refuse(stream, peer.ip());
                            continue;
                        }
                    },
                };
                let router = router.clone();
                let http = http.clone();
                let send_timeout = options.idle_timeout;
                let watcher = graceful.watcher();
                let dropped = dropped.clone();
                let serve = move |stream: tokio::net::TcpStream| async move {
                    let _slot = (slot, client);
                    let (handle, mut close_at) = Connection::new();
                    let service = tower::service_fn(move |mut request: http::Request<Incoming>| {
                        request.extensions_mut().insert(Arrival {
                            at: Instant::now(),
                            connection: handle.clone(),
                        });
                        router.clone().oneshot(request)
                    });
                    // A client that accepts no byte for the idle timeout loses
                    // the connection (GW-17), whatever the response.
                    let io = TokioIo::new(SendTimeout::new(stream, send_timeout));
                    let conn = http.serve_connection(io, TowerToHyperService::new(service));
                    let conn = watcher.watch(conn);
                    tokio::select! {
                        ended = conn => {
                            if let Err(e) = ended {
                                tracing::debug!(error = %e, "connection ended with an error");
                            }
                        }
                        () = connection::closing(&mut close_at) => {
                            tracing::debug!("dropping a connection whose response outlived its deadline");
                        }
                        () = dropped.cancelled() => {
                            tracing::debug!("dropping a connection left after shutdown");
                        }
                    }
                };
                match &threads {
                    None => {
                        tokio::spawn(serve(stream));
                    }
                    // The socket moves to the thread's own reactor.
                    Some(threads) => match stream.into_std() {
                        Ok(stream) => threads.spawn(move || async move {
                            match tokio::net::TcpStream::from_std(stream) {
                                Ok(stream) => serve(stream).await,
                                Err(e) => tracing::warn!(error = %e, "cannot serve an accepted connection"),
                            }
                        }),
                        Err(e) => tracing::warn!(error = %e, "cannot hand an accepted connection over"),
                    },
                }
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    tracing::info!(
        grace_s = options.shutdown_grace.as_secs_f64(),
        "shutting down"
    );
    stop_metrics.cancel();
    let states = live.begin_shutdown();
    let drained = tokio::time::timeout(options.shutdown_grace, graceful.shutdown()).await;
    if drained.is_err() {
        tracing::warn!("grace period over: cancelling the calls still running");
    }
    // Cancels whatever still runs — streams end at once, polled or not
    // (the engine's stream watchdog) — and waits until every permit is
    // back, but never longer than the cleanup budget.
    let cleanup = async {
        for app in &states {
            for controller in app.controllers() {
                controller.close().await;
            }
        }
    };
    if tokio::time::timeout(options.cleanup_budget, cleanup)
        .await
        .is_err()
    {
        tracing::warn!(
            budget_s = options.cleanup_budget.as_secs_f64(),
            upstream_active = states
                .iter()
                .map(|a| a.upstream_snapshot().active)
                .sum::<usize>(),
            tenant_active = states
                .iter()
                .map(|a| a.tenant_snapshot().active)
                .sum::<usize>(),
            "cleanup budget over: stopping without waiting for the remaining permits"
        );
    }
    // Connections still open get a moment to deliver the error events that
    // ended their streams (every connection returns its slot when it
    // ends), then whatever is left is dropped.
    let all = u32::try_from(cap).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(connection::LINGER, slots.acquire_many(all)).await;
    dropped.cancel();
    drop(threads);
    flusher.abort();
    sampler.abort();
    let current = live.current();
    current.access_log.finish(access_log::FINISH_WITHIN).await;
    let dropped = current.access_log.dropped();
    if dropped > 0 {
        tracing::warn!(
            dropped,
            "access lines dropped since the start: standard output did not take them"
        );
    }
    // The last spans go out, within the export timeout (SPEC OBS-5).
    let telemetry = &current.telemetry;
    let bound = current.config.telemetry.export_timeout;
    let _ = tokio::time::timeout(bound, telemetry.flush()).await;
    Ok(())
}

/// Serves `router` on the side listener (`server.metrics_listen`: metrics
/// and the status page) until `stop` is cancelled, under the API
/// listener's bounds (SPEC GW-7, GW-17), the per-client cap excepted: at
/// most as many connections as `slots` has permits (further ones wait in
/// the backlog), the request
/// head read under `http`'s header timeout and size limit, and a client
/// that accepts no response byte for `send_timeout` dropped. Once `stop`
/// is cancelled, connections finish their response within
/// [`connection::LINGER`] and are then dropped.
async fn serve_side(
    listener: TcpListener,
    router: axum::Router,
    http: http1::Builder,
    slots: Arc<Semaphore>,
    send_timeout: Duration,
    stop: CancellationToken,
) {
    loop {
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => return,
            },
            () = stop.cancelled() => return,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                // Out of file descriptors and the like: keep serving.
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed on the metrics listener");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stop.cancelled() => return,
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(SendTimeout::new(stream, send_timeout));
        let conn = http.serve_connection(io, TowerToHyperService::new(router.clone()));
        let stop = stop.clone();
        tokio::spawn(async move {
            let _slot = slot;
            tokio::pin!(conn);
            tokio::select! {
                ended = conn.as_mut() => {
                    if let Err(e) = ended {
                        tracing::debug!(error = %e, "metrics connection ended with an error");
                    }
                }
                () = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(connection::LINGER, conn).await;
                }
            }
        });
    }
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
