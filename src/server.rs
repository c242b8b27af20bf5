//! Listeners, accept loops, admin routes and the shutdown sequence. Serves an [`App`]; the
//! request path itself is `front`.
//!
//! Shutdown (the `shutdown` future resolves, e.g. on SIGTERM) loses nothing it can keep:
//! ```text
//! drain    readiness 503 at once; new input-capable calls and listen streams refused (503 +
//!          Retry-After); listen streams end; retries, lists and in-flight calls are served, and
//!          the listener stays open so retries reach their parked calls — until no call is left
//!          and no request has come for `DRAIN_QUIET` (a client's follow-up right after its
//!          result still lands), or `server.shutdown_grace` passes
//! cancel   the listener closes; calls still open cancel upstream (cancel answers to pending
//!          server requests, then notifications/cancelled, each acknowledged by the upstream) and
//!          answer their client 503 — within `server.shutdown_cancel_timeout`
//! close    connections finish their last answers; every upstream session is DELETEd
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::app::App;
use crate::body::{full, Body};
use crate::ops::metrics::{AcceptFailure, Limit, Snapshot};
use crate::{edge, front};

/// How long connections get, after the cancel phase, to deliver their last answers.
const CONNECTION_CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// The exposition format of `/metrics`.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Connections the admin listener serves at once, apart from `server.max_connections`: probes
/// and scrapes keep answering while the MCP port is saturated.
const ADMIN_CONNECTIONS: usize = 64;
/// The drain ends early only after this long with no call open and no request seen.
const DRAIN_QUIET: Duration = Duration::from_millis(250);

mod accept;
mod background;
mod conns;
mod descriptors;

pub use descriptors::raise_descriptor_limit;

pub(crate) use accept::AcceptBackoff;
use conns::{Admitted, Conns};

/// The sockets to serve: the MCP endpoint, and optionally a separate admin one.
#[derive(Debug)]
pub struct Listeners {
    /// The MCP endpoint (and, without `admin`, the admin routes too).
    pub main: TcpListener,
    /// `/healthz`, `/readyz`, `/metrics` only (`[admin] listen`).
    pub admin: Option<TcpListener>,
}

/// Requests on the main listener: how many are being answered, and when the last one started or
/// was answered (the drain waits for a quiet moment).
#[derive(Debug)]
struct Activity {
    in_flight: AtomicUsize,
    last: Mutex<Instant>,
}

struct InFlight<'a>(&'a Activity);

impl Activity {
    fn new() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            last: Mutex::new(Instant::now()),
        }
    }

    fn begin(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.touch();
        InFlight(self)
    }

    fn touch(&self) {
        if let Ok(mut t) = self.last.lock() {
            *t = Instant::now();
        }
    }

    /// When the main listener went quiet; `None` while a request is being answered.
    fn quiet_since(&self) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        self.last.lock().ok().map(|t| *t)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Clone, Copy)]
enum Routes {
    /// The MCP endpoint, `/.well-known/`, and the admin routes unless they have their own socket.
    Main {
        with_admin: bool,
    },
    Admin,
}

/// Serves `listener` (MCP and admin routes) until `shutdown` resolves, then shuts down as the
/// module doc says.
pub async fn run(listener: TcpListener, app: Arc<App>, shutdown: impl Future<Output = ()>) {
    let listeners = Listeners {
        main: listener,
        admin: None,
    };
    serve(listeners, app, shutdown).await;
}

// The MCP URL this instance announces to the replicas sharing its task store: the configured
// one, else the bound listen address when it names one host (not 0.0.0.0 or ::).
fn advertised(app: &App, listeners: &Listeners) -> Option<http::Uri> {
    if let Some(url) = &app.config.cluster.advertise {
        return Some(url.clone());
    }
    let bound = listeners.main.local_addr().ok()?;
    if bound.ip().is_unspecified() {
        tracing::warn!(
            "tasks.store is shared but this instance has no address to announce (listening on \
             every interface): set cluster.advertise or MRTR_CLUSTER_ADVERTISE, or list the \
             replicas in cluster.peers"
        );
        return None;
    }
    format!("http://{bound}{}", app.config.server.mcp_path)
        .parse()
        .ok()
}

/// Serves `listeners` until `shutdown` resolves, then shuts down as the module doc says.
pub async fn serve(listeners: Listeners, app: Arc<App>, shutdown: impl Future<Output = ()>) {
    let conns = Conns::new(app.config.server.max_connections);
    if let Some(addresses) = app.calls.tasks.addresses() {
        if let Some(url) = advertised(&app, &listeners) {
            addresses.advertise(&url);
        }
    }
    let background = tokio::spawn(background::run(Arc::clone(&app)));
    let reloads = tokio::spawn(crate::ops::shutdown::on_hangup({
        let app = Arc::clone(&app);
        move || reload_keys(&app)
    }));
    let activity = Arc::new(Activity::new());
    let main = Routes::Main {
        with_admin: listeners.admin.is_none(),
    };
    // Probes keep their answers (readiness 503 during the drain) until the process exits.
    let admin = listeners.admin.map(|l| {
        let app = Arc::clone(&app);
        let conns = Conns::new(ADMIN_CONNECTIONS);
        let idle = Arc::new(Activity::new());
        tokio::spawn(async move { accept(&l, &app, &idle, &conns, Routes::Admin).await })
    });
    let serving = accept(&listeners.main, &app, &activity, &conns, main);
    tokio::select! {
        () = serving => {}
        () = shutdown => {}
    }
    // Reaping and readiness probing end here: the shutdown closes every session itself.
    background.abort();
    reloads.abort();
    let serving = Serving {
        listener: listeners.main,
        app,
        activity,
        conns,
        routes: main,
    };
    serving.shut_down().await;
    if let Some(a) = admin {
        a.abort();
    }
}

/// The main listener being served, taken through the shutdown sequence.
struct Serving {
    listener: TcpListener,
    app: Arc<App>,
    activity: Arc<Activity>,
    conns: Arc<Conns>,
    routes: Routes,
}

impl Serving {
    async fn shut_down(self) {
        let Self {
            listener,
            app,
            activity,
            conns,
            routes,
        } = self;
        tracing::info!("shutting down: draining");
        app.begin_drain();
        let grace = app.config.server.shutdown_grace;
        let serving = accept(&listener, &app, &activity, &conns, routes);
        tokio::select! {
            () = serving => {}
            drained = drain(&app, &activity, grace) => if !drained {
                tracing::warn!(open_calls = app.calls.open(), ?grace, "shutdown grace elapsed with calls still open: cancelling them upstream");
            },
        }
        drop(listener);
        app.cancel_all();
        let cancel = app.config.server.shutdown_cancel_timeout;
        if tokio::time::timeout(cancel, app.calls.wait_idle())
            .await
            .is_err()
        {
            tracing::warn!(
                open_calls = app.calls.open(),
                "calls did not finish cancelling in time"
            );
        }
        conns.close_all();
        let _ = tokio::time::timeout(CONNECTION_CLOSE_TIMEOUT, conns.all_closed()).await;
        // Legacy clients' own sessions: children stopped and reaped.
        let _ = tokio::time::timeout(cancel, app.bridge.close_all()).await;
        app.pool.close_all(cancel).await;
        tracing::info!("shut down");
    }
}

// True once no call is open and the listener has been quiet for `DRAIN_QUIET`; false when the
// grace ran out first.
async fn drain(app: &App, activity: &Activity, grace: Duration) -> bool {
    let deadline = Instant::now() + grace;
    loop {
        if tokio::time::timeout_at(deadline, app.calls.wait_idle())
            .await
            .is_err()
        {
            return false;
        }
        let next_look = match activity.quiet_since() {
            Some(t) if t.elapsed() >= DRAIN_QUIET => return true,
            Some(t) => t + DRAIN_QUIET,
            None => Instant::now() + DRAIN_QUIET,
        };
        if next_look >= deadline {
            tokio::time::sleep_until(deadline).await;
            return app.calls.open() == 0 && activity.quiet_since().is_some();
        }
        tokio::time::sleep_until(next_look).await;
    }
}

// Accepts connections forever (each holding a slot of `conns`), serving `routes` on each.
async fn accept(
    listener: &TcpListener,
    app: &Arc<App>,
    activity: &Arc<Activity>,
    conns: &Arc<Conns>,
    routes: Routes,
) {
    let settings = ConnSettings::of(&app.config);
    let mut backoff = AcceptBackoff::new();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => {
                backoff.accepted();
                x
            }
            Err(e) => {
                app.metrics.accept_failed(AcceptFailure::of(&e));
                backoff.failed(&e).await;
                continue;
            }
        };
        let Some((slot, shed)) = conns.admit(settings.header_timeout).await else {
            tracing::debug!(%peer, open = conns.len(), "no connection slot came free: closing the new connection");
            continue;
        };
        if shed {
            app.metrics.limit_hit(Limit::IdleConnectionShed);
            tracing::debug!(%peer, "shed the longest-idle connection to admit a new one");
        }
        // SSE events are small writes; Nagle would hold them back behind delayed ACKs.
        let _ = stream.set_nodelay(true);
        let slot = Arc::new(slot);
        let app = Arc::clone(app);
        let activity = Arc::clone(activity);
        let on_conn = Arc::clone(&slot);
        let svc = service_fn(move |req| {
            let app = Arc::clone(&app);
            let activity = Arc::clone(&activity);
            // The connection is busy until the answer's body ends, not just its head.
            let busy = on_conn.busy();
            async move {
                let _in_flight = activity.begin();
                let resp = route(app, req, routes).await;
                Ok::<_, Infallible>(resp.map(|b| crate::body::hold(b, busy)))
            }
        });
        let accepted = Accepted {
            stream,
            peer,
            slot,
            settings,
        };
        tokio::spawn(accepted.serve(svc));
    }
}

/// One accepted connection, its slot, and what it is served with.
struct Accepted {
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    slot: Arc<Admitted>,
    settings: ConnSettings,
}

/// The bounds every connection is served with.
#[derive(Clone, Copy)]
struct ConnSettings {
    header_timeout: Duration,
    max_headers: usize,
    max_header_bytes: usize,
}

impl ConnSettings {
    fn of(config: &crate::config::Config) -> Self {
        Self {
            header_timeout: config.server.header_read_timeout,
            max_headers: config.server.limits.max_headers,
            max_header_bytes: config.server.limits.max_header_bytes,
        }
    }

    // hyper answers 431 to a head past these bounds (HTTP/1), or refuses the stream (HTTP/2);
    // with a timer it closes an HTTP/1 connection whose next request head does not arrive in
    // time (slow headers, idle keep-alive).
    fn builder(self) -> auto::Builder<TokioExecutor> {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_timeout)
            .max_headers(self.max_headers)
            .max_buf_size(self.max_header_bytes);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(self.max_header_bytes).unwrap_or(u32::MAX));
        builder
    }
}

impl Accepted {
    async fn serve<S>(self, svc: S)
    where
        S: hyper::service::Service<
                Request<Incoming>,
                Response = Response<Body>,
                Error = Infallible,
            > + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
    {
        let Self {
            stream,
            peer,
            slot,
            settings,
        } = self;
        // Telling HTTP/1 from HTTP/2 waits for the first bytes with no deadline of its own: a
        // socket that never sends one would hold its slot for good. (`readable()` may report
        // a fresh socket ready early; a peek waits for a real byte.)
        let mut first = [0u8; 1];
        if tokio::time::timeout(settings.header_timeout, stream.peek(&mut first))
            .await
            .is_err()
        {
            tracing::debug!(%peer, "closing a connection that sent nothing");
            return;
        }
        let builder = settings.builder();
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), svc)
            .into_owned();
        let mut conn = std::pin::pin!(conn);
        // Shed (the table needs the room) or shutting down: finish what is in flight, then
        // close.
        let ended = tokio::select! {
            r = conn.as_mut() => r,
            () = slot.close_requested() => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        };
        if let Err(e) = ended {
            tracing::debug!(%peer, error = %e, "connection ended with an error");
        }
    }
}

async fn route(app: Arc<App>, req: Request<Incoming>, routes: Routes) -> Response<Body> {
    let path = req.uri().path();
    if let Routes::Main { with_admin } = routes {
        let server = &app.config.server;
        if path == server.mcp_path || path == server.sse_path || path == server.sse_messages_path {
            return front::handle(app, req).await;
        }
        if req.method() == Method::GET && path.starts_with("/.well-known/") {
            use http_body_util::BodyExt;
            let req = req.map(|b| b.map_err(Into::into).boxed());
            return front::well_known(&app, req).await;
        }
        if !with_admin {
            return edge::text(StatusCode::NOT_FOUND, "not found\n");
        }
    }
    admin(&app, req.method(), path)
}

fn admin(app: &App, method: &Method, path: &str) -> Response<Body> {
    match (method, path) {
        (&Method::GET, "/healthz") => edge::text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/readyz") if app.is_draining() => {
            edge::text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
        }
        // A task store that does not answer keeps the replica in service (calls work; they
        // stay ordinary calls), and says so.
        (&Method::GET, "/readyz") if app.pool.is_ready() && !app.calls.tasks.store_up() => {
            edge::text(
                StatusCode::OK,
                "ready; task store unreachable: new calls are not made tasks\n",
            )
        }
        (&Method::GET, "/readyz") if app.pool.is_ready() => edge::text(StatusCode::OK, "ready\n"),
        (&Method::GET, "/readyz") => edge::text(
            StatusCode::SERVICE_UNAVAILABLE,
            "upstream not initialized yet\n",
        ),
        (&Method::GET, "/metrics") => {
            let now = Snapshot {
                parked: app.parked_calls(),
                parked_bytes: app.calls.parked.held_bytes(),
                task_bytes: app.calls.tasks.held_bytes(),
                sessions: app.pool.open_sessions(),
                idle_sessions: app.idle_sessions(),
                session_waiters: app.session_waiters(),
                legacy_sessions: app.bridge.open(),
                listen_sessions: app.listen_sessions(),
            };
            let mut r = Response::new(full(app.metrics.render(now)));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(OPENMETRICS),
            );
            r
        }
        _ => edge::text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

// SIGHUP: the key files read again; a failure keeps the keys in use.
fn reload_keys(app: &App) {
    match app.reload_keys() {
        Ok(kid) => tracing::info!(signing_kid = %kid, kids = ?app.key_ids(), "state keys reloaded"),
        Err(e) => tracing::error!(error = %e, "state keys not reloaded; the current keys stay"),
    }
}
