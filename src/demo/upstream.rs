//! A small built-in **legacy** (2025-11-25) Streamable HTTP MCP server for `mrtr-proxy demo` and
//! the in-process tests. It does what real legacy servers do: sessions, SSE answers, inline
//! server requests on the call's stream (and `roots/list` on the GET stream, like Python mcp 1.x).
//! This file is its HTTP side (sessions, POST, GET stream, DELETE); what a session answers and
//! asks is `session`. Tools: `echo`, `progress`, `ask_name` (elicits), `summarize` (samples), `list_roots`,
//! `everything` (elicit + sample + roots at once), `twice` (two elicitations in sequence),
//! `provision` (slow; asks for approval half way).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::TcpListener;

use super::session::{dispatch, init_result, Out, Sess};
use crate::body::{empty, full, Body, ChannelBody};
use crate::server::AcceptBackoff;

/// A running demo upstream.
#[derive(Debug)]
pub struct DemoUpstream {
    addr: SocketAddr,
    path: &'static str,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

/// What the demo server saw (for tests).
#[derive(Debug, Default)]
pub struct Observed {
    /// Every JSON-RPC message POSTed (or written) to it, in order.
    pub posted: Vec<Value>,
    /// Session ids DELETEd.
    pub deleted: Vec<String>,
    /// `initialize` params received.
    pub initialized: Vec<Value>,
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) sessions: Mutex<HashMap<String, Arc<Sess>>>,
    counter: AtomicU64,
    pub(super) observed: Mutex<Observed>,
}

impl DemoUpstream {
    /// Starts on `127.0.0.1:0`.
    ///
    /// # Errors
    /// If binding fails.
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State::default());
        let st = Arc::clone(&state);
        let task = serve(listener, st, handle);
        Ok(Self {
            addr,
            path: "/mcp",
            state,
            task,
        })
    }

    /// The MCP endpoint URL (the SSE URL of the HTTP+SSE flavour).
    pub fn url(&self) -> String {
        format!("http://{}{}", self.addr, self.path)
    }

    pub(super) fn assemble(
        addr: SocketAddr,
        path: &'static str,
        state: Arc<State>,
        task: tokio::task::JoinHandle<()>,
    ) -> Self {
        Self {
            addr,
            path,
            state,
            task,
        }
    }

    /// Runs `f` over what the server observed so far.
    pub fn observed<T>(&self, f: impl FnOnce(&Observed) -> T) -> Option<T> {
        self.state.observed.lock().ok().map(|o| f(&o))
    }

    /// Drops every session (the next request on one gets 404), like a restarted server.
    pub fn forget_sessions(&self) {
        if let Ok(mut s) = self.state.sessions.lock() {
            s.clear();
        }
    }
}

/// Serves HTTP on `listener` (no Nagle delay, like Node and asyncio servers), calling
/// `handler(state, request)` for each request; used by the demo upstream and the test mock.
pub fn serve<S, F, Fut>(
    listener: TcpListener,
    state: Arc<S>,
    handler: F,
) -> tokio::task::JoinHandle<()>
where
    S: Send + Sync + 'static,
    F: Fn(Arc<S>, Request<Incoming>) -> Fut + Copy + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Body>> + Send + 'static,
{
    tokio::spawn(async move {
        let mut backoff = AcceptBackoff::new();
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => {
                    backoff.accepted();
                    stream
                }
                Err(e) => {
                    backoff.failed(&e).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let st = Arc::clone(&state);
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let st = Arc::clone(&st);
                    async move { Ok::<_, Infallible>(handler(st, req).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    })
}

impl Drop for DemoUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(st: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let sid = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let sess = sid
        .as_ref()
        .and_then(|id| st.sessions.lock().ok()?.get(id).cloned());
    match *req.method() {
        Method::GET => match sess {
            Some(s) => {
                let (tx, body) = ChannelBody::channel(16);
                if let Ok(mut g) = s.get_tx.lock() {
                    *g = Some(Out::Sse(tx));
                }
                sse_response(body)
            }
            None => status(StatusCode::NOT_FOUND),
        },
        Method::DELETE => {
            if let (Some(id), Ok(mut map)) = (sid, st.sessions.lock()) {
                map.remove(&id);
                if let Ok(mut o) = st.observed.lock() {
                    o.deleted.push(id);
                }
            }
            status(StatusCode::OK)
        }
        Method::POST => {
            let Ok(bytes) = req.into_body().collect().await.map(|c| c.to_bytes()) else {
                return status(StatusCode::BAD_REQUEST);
            };
            let Ok(msg) = serde_json::from_slice::<Value>(&bytes) else {
                return status(StatusCode::BAD_REQUEST);
            };
            if let Ok(mut o) = st.observed.lock() {
                o.posted.push(msg.clone());
            }
            post(st, sid, sess, msg).await
        }
        _ => status(StatusCode::METHOD_NOT_ALLOWED),
    }
}

async fn post(
    st: Arc<State>,
    sid: Option<String>,
    sess: Option<Arc<Sess>>,
    msg: Value,
) -> Response<Body> {
    let method = msg
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let id = msg.get("id").cloned();
    if method == "initialize" {
        observe_initialize(&st, &msg);
        let (new_id, _) = new_session(&st);
        let (tx, body) = ChannelBody::channel(4);
        Out::Sse(tx)
            .send(&json!({"jsonrpc":"2.0","id":id,"result":init_result()}))
            .await;
        let mut r = sse_response(body);
        if let Ok(v) = HeaderValue::from_str(&new_id) {
            r.headers_mut().insert("mcp-session-id", v);
        }
        return r;
    }
    let Some(sess) = sess else {
        let code = if sid.is_some() {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::BAD_REQUEST
        };
        let mut r = Response::new(full(
            r#"{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Bad Request: Missing session ID"}}"#,
        ));
        *r.status_mut() = code;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        return r;
    };
    let (tx, body) = ChannelBody::channel(16);
    dispatch(sess, msg, Out::Sse(tx));
    if method.is_empty() || id.is_none() {
        return status(StatusCode::ACCEPTED);
    }
    sse_response(body)
}

/// Records an `initialize` message's params.
pub(super) fn observe_initialize(st: &State, msg: &Value) {
    if let Ok(mut o) = st.observed.lock() {
        o.initialized.push(msg["params"].clone());
    }
}

/// A new session and its id.
pub(super) fn new_session(st: &State) -> (String, Arc<Sess>) {
    let n = st.counter.fetch_add(1, Ordering::Relaxed);
    let new_id = format!("demo-session-{n}");
    let s = Arc::new(Sess::new());
    if let Ok(mut m) = st.sessions.lock() {
        m.insert(new_id.clone(), Arc::clone(&s));
    }
    (new_id, s)
}

pub(super) fn sse_response(body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    r
}

pub(super) fn status(code: StatusCode) -> Response<Body> {
    let mut r = Response::new(empty());
    *r.status_mut() = code;
    r
}
