//! Listener, accept loop, admin routes and graceful shutdown. Serves an [`App`]; the request
//! path itself is `front`.

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

use crate::app::App;
use crate::body::{full, Body};
use crate::{edge, front};

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
        app.calls.parked.wait_empty().await;
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
        return front::handle(app, req).await;
    }
    if req.method() == Method::GET && path.starts_with("/.well-known/") {
        use http_body_util::BodyExt;
        let req = req.map(|b| b.map_err(Into::into).boxed());
        return front::relay_same_path(&app, req).await;
    }
    match (req.method(), path) {
        (&Method::GET, "/healthz") => edge::text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/readyz") if app.pool.is_ready() => edge::text(StatusCode::OK, "ready\n"),
        (&Method::GET, "/readyz") => edge::text(
            StatusCode::SERVICE_UNAVAILABLE,
            "upstream not initialized yet\n",
        ),
        (&Method::GET, "/metrics") => {
            let mut r = Response::new(full(app.metrics.render(
                app.parked_calls(),
                app.idle_sessions(),
                app.session_waiters(),
            )));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            r
        }
        _ => edge::text(StatusCode::NOT_FOUND, "not found\n"),
    }
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
        app.calls.parked.sweep();
    }
}
