//! Listener, accept loop, admin routes and graceful shutdown. Owns [`App`], the one shared state.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::body::{full, Body};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::parked::ParkedCalls;
use crate::state_token::{random_id, random_secret, TokenCodec};
use crate::upstream::pool::PoolConfig;
use crate::upstream::{SessionPool, UpstreamClient};

/// Everything a request needs, shared behind one `Arc`.
#[derive(Debug)]
pub struct App {
    /// Validated configuration.
    pub config: Config,
    /// Legacy session pool (and the upstream client inside it).
    pub pool: Arc<SessionPool>,
    /// Parked calls.
    pub parked: Arc<ParkedCalls>,
    /// requestState signer/verifier.
    pub tokens: TokenCodec,
    /// Counters for `/metrics`.
    pub metrics: Metrics,
    /// Flips to `true` when the proxy shuts down; call actors then cancel their upstream calls.
    pub shutdown: tokio::sync::watch::Sender<bool>,
}

impl App {
    /// Builds the state from a config. Generates a signing key when none is configured.
    pub fn new(config: Config) -> Arc<Self> {
        let client = UpstreamClient::new(
            config.upstream.clone(),
            config.upstream_timeout,
            config.max_sse_event_bytes,
        );
        let pool = SessionPool::new(
            client,
            PoolConfig {
                max_sessions: config.max_sessions,
                idle_timeout: config.session_idle,
                acquire_timeout: config.session_acquire_timeout,
                protocol_version: config.upstream_protocol_version.clone(),
                default_roots: Arc::new(config.default_roots.clone()),
            },
        );
        let secret = match &config.state_secret {
            Some(s) => s.clone(),
            None => {
                tracing::info!("no state.secret configured: generated a random signing key (single instance only; tokens die with the process)");
                random_secret()
            }
        };
        let issuer = config.instance_id.clone().unwrap_or_else(|| random_id(9));
        let tokens = TokenCodec::new(&secret, issuer, config.state_ttl);
        let parked = ParkedCalls::new(
            config.max_parked,
            config.max_parked_per_principal,
            config.state_ttl,
        );
        Arc::new(Self {
            config,
            pool,
            parked,
            tokens,
            metrics: Metrics::default(),
            shutdown: tokio::sync::watch::channel(false).0,
        })
    }
}

/// Serves `listener` until `shutdown` resolves, then drains for at most the grace period.
pub async fn run(listener: TcpListener, app: Arc<App>, shutdown: impl Future<Output = ()>) {
    let graceful = GracefulShutdown::new();
    let conns = Arc::new(Semaphore::new(app.config.max_connections));
    let background = tokio::spawn(background(Arc::clone(&app)));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&conns).acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // SSE events are small writes; Nagle would hold them back behind delayed ACKs.
        let _ = stream.set_nodelay(true);
        let app = Arc::clone(&app);
        let svc = service_fn(move |req| {
            let app = Arc::clone(&app);
            async move { Ok::<_, Infallible>(route(app, req).await) }
        });
        let builder = auto::Builder::new(TokioExecutor::new());
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc);
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    background.abort();
    // Parked and running calls answer their clients (503) and cancel upstream; then connections
    // drain and idle sessions are closed, all within the grace period.
    app.shutdown.send_replace(true);
    let grace = app.config.shutdown_grace;
    let drain = async {
        graceful.shutdown().await;
        app.parked.wait_empty().await;
    };
    if tokio::time::timeout(grace, drain).await.is_err() {
        tracing::warn!(
            ?grace,
            "shutdown grace period elapsed with calls still open"
        );
    }
    app.pool.close_all().await;
}

async fn route(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path();
    if path == app.config.mcp_path {
        return crate::proxy::handle(app, req).await;
    }
    if req.method() == Method::GET && path.starts_with("/.well-known/") {
        use http_body_util::BodyExt;
        let req = req.map(|b| b.map_err(Into::into).boxed());
        return crate::relay::relay_same_path(&app, req).await;
    }
    match (req.method(), path) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/readyz") if app.pool.is_ready() => text(StatusCode::OK, "ready\n"),
        (&Method::GET, "/readyz") => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "upstream not initialized yet\n",
        ),
        (&Method::GET, "/metrics") => {
            let mut r = Response::new(full(app.metrics.render(
                app.parked.len(),
                app.pool.idle_count(),
                app.pool.waiters(),
            )));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            r
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r
}

// Readiness probe until the upstream first answers, idle-session reaping, tombstone sweeping.
async fn background(app: Arc<App>) {
    let mut delay = Duration::from_millis(100);
    while !app.pool.is_ready() {
        if app.pool.probe().await {
            tracing::info!(upstream = %app.config.upstream, "upstream answered initialize; ready");
            break;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
    let period =
        (app.config.session_idle / 2).clamp(Duration::from_millis(100), Duration::from_secs(30));
    let mut tick = tokio::time::interval(period);
    loop {
        tick.tick().await;
        let closed = app.pool.reap_idle().await;
        if closed > 0 {
            tracing::debug!(closed, "closed idle upstream sessions");
        }
        app.parked.sweep();
    }
}
