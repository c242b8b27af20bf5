//! A small built-in **legacy** (2025-11-25) Streamable HTTP MCP server for `mrtr-proxy demo` and
//! the in-process tests. It does what real legacy servers do: sessions, SSE answers, inline
//! server requests on the call's stream (and `roots/list` on the GET stream, like Python mcp 1.x).
//!
//! Tools: `echo`, `progress`, `ask_name` (elicits), `summarize` (samples), `list_roots`,
//! `everything` (elicit + sample + roots at once), `twice` (two elicitations in sequence).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use crate::body::{empty, full, Body, ChannelBody};
use crate::server::AcceptBackoff;
use crate::sse;

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

#[derive(Debug)]
pub(super) struct Sess {
    next_id: AtomicI64,
    waiting: Mutex<HashMap<i64, oneshot::Sender<Value>>>,
    /// The GET stream (Streamable HTTP), or the session's one stream (HTTP+SSE, stdio).
    pub(super) get_tx: Mutex<Option<Out>>,
}

/// Where a message to the client goes: an SSE stream (events) or stdout (lines).
#[derive(Debug, Clone)]
pub(super) enum Out {
    Sse(mpsc::Sender<Bytes>),
    Lines(mpsc::Sender<Bytes>),
}

impl Out {
    pub(super) async fn send(&self, msg: &Value) {
        let json = msg.to_string();
        let _ = match self {
            Self::Sse(tx) => tx.send(sse::encode_message(json.as_bytes())).await,
            Self::Lines(tx) => tx.send(Bytes::from(json + "\n")).await,
        };
    }
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
    let s = Arc::new(Sess {
        next_id: AtomicI64::new(0),
        waiting: Mutex::new(HashMap::new()),
        get_tx: Mutex::new(None),
    });
    if let Ok(mut m) = st.sessions.lock() {
        m.insert(new_id.clone(), Arc::clone(&s));
    }
    (new_id, s)
}

/// The `InitializeResult` of the demo server.
pub(super) fn init_result() -> Value {
    json!({
        "protocolVersion": "2025-11-25",
        "capabilities": {"tools": {"listChanged": true}, "prompts": {}, "resources": {}, "logging": {}},
        "serverInfo": {"name": "mrtr-demo-upstream", "version": env!("CARGO_PKG_VERSION")},
        "instructions": "A demo legacy server that asks for input mid-call.",
    })
}

/// One message of an open session: an answer to one of our server requests wakes its waiter; a
/// request runs in a task of its own and is answered on `out`; a notification is dropped.
pub(super) fn dispatch(sess: Arc<Sess>, msg: Value, out: Out) {
    let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
    let id = msg.get("id").cloned();
    if method.is_empty() {
        if let Some(n) = id.as_ref().and_then(Value::as_i64) {
            let waiter = sess.waiting.lock().ok().and_then(|mut w| w.remove(&n));
            if let Some(w) = waiter {
                let _ = w.send(
                    msg.get("result")
                        .cloned()
                        .unwrap_or_else(|| json!({"error": msg.get("error")})),
                );
            }
        }
        return;
    }
    let Some(id) = id else { return };
    let method = method.to_owned();
    let params = msg.get("params").cloned().unwrap_or(Value::Null);
    tokio::spawn(async move {
        let call = CallCtx {
            sess,
            tx: out.clone(),
            params,
        };
        let outcome = match method.as_str() {
            "tools/list" => Ok(json!({"tools": tools()})),
            "tools/call" => run_tool(&call).await,
            "prompts/list" => {
                Ok(json!({"prompts": [{"name": "greeting", "description": "Asks who to greet"}]}))
            }
            "prompts/get" => prompt(&call).await,
            "resources/list" => Ok(json!({"resources": [{"uri": "demo://motd", "name": "motd"}]})),
            "resources/read" => read(&call).await,
            "ping" => Ok(json!({})),
            other => Err(json!({"code": -32601, "message": format!("Method not found: {other}")})),
        };
        let msg = match outcome {
            Ok(result) => json!({"jsonrpc":"2.0","id":id,"result":result}),
            Err(error) => json!({"jsonrpc":"2.0","id":id,"error":error}),
        };
        out.send(&msg).await;
    });
}

struct CallCtx {
    sess: Arc<Sess>,
    tx: Out,
    params: Value,
}

impl CallCtx {
    fn arg(&self, k: &str) -> Option<&Value> {
        self.params.get("arguments").and_then(|a| a.get(k))
    }

    async fn notify(&self, method: &str, params: Value) {
        let m = json!({"jsonrpc":"2.0","method":method,"params":params});
        self.tx.send(&m).await;
    }

    // Sends a server request on the call stream (or the GET stream) and waits for the answer.
    async fn ask(&self, method: &str, params: Value, on_get_stream: bool) -> Result<Value, Value> {
        let id = self.sess.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        if let Ok(mut w) = self.sess.waiting.lock() {
            w.insert(id, tx);
        }
        let m = json!({"jsonrpc":"2.0","id":id,"method":method,"params":params});
        let sender = if on_get_stream {
            self.sess.get_tx.lock().ok().and_then(|g| g.clone())
        } else {
            Some(self.tx.clone())
        };
        let Some(sender) = sender else {
            return Err(json!({"code": -32603, "message": "no GET stream open"}));
        };
        sender.send(&m).await;
        match tokio::time::timeout(Duration::from_secs(300), rx).await {
            Ok(Ok(v)) if v.get("error").is_none() => Ok(v),
            Ok(Ok(v)) => Err(v["error"].clone()),
            _ => Err(json!({"code": -32603, "message": "no answer"})),
        }
    }

    async fn elicit_name(&self, message: &str) -> Result<String, Value> {
        let schema =
            json!({"type":"object","properties":{"name":{"type":"string"}},"required":["name"]});
        let r = self
            .ask(
                "elicitation/create",
                json!({"mode":"form","message":message,"requestedSchema":schema}),
                false,
            )
            .await?;
        Ok(match r["action"].as_str() {
            Some("accept") => r["content"]["name"].as_str().unwrap_or("?").to_owned(),
            Some(other) => format!("<{other}>"),
            None => "<invalid>".to_owned(),
        })
    }

    async fn sample(&self, text: &str) -> Result<String, Value> {
        let p = json!({"messages":[{"role":"user","content":{"type":"text","text":format!("Summarize: {text}")}}],"maxTokens":100});
        let r = self.ask("sampling/createMessage", p, false).await?;
        Ok(r["content"]["text"].as_str().unwrap_or("").to_owned())
    }

    async fn roots(&self) -> Result<String, Value> {
        let r = self.ask("roots/list", json!({}), true).await?;
        let uris: Vec<&str> = r["roots"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x["uri"].as_str())
            .collect();
        Ok(uris.join(", "))
    }
}

fn tools() -> Value {
    let obj = |props: Value| json!({"type":"object","properties":props});
    json!([
        {"name":"echo","description":"Echoes text","inputSchema":obj(json!({"text":{"type":"string"}})),"execution":{"taskSupport":"forbidden"}},
        {"name":"progress","description":"Reports progress","inputSchema":obj(json!({"steps":{"type":"integer"}}))},
        {"name":"ask_name","description":"Elicits a name","inputSchema":obj(json!({}))},
        {"name":"summarize","description":"Samples a summary","inputSchema":obj(json!({"text":{"type":"string"}}))},
        {"name":"list_roots","description":"Lists client roots (on the GET stream)","inputSchema":obj(json!({}))},
        {"name":"everything","description":"Elicit + sample + roots at once","inputSchema":obj(json!({}))},
        {"name":"twice","description":"Elicits twice in sequence","inputSchema":obj(json!({}))},
    ])
}

fn text(t: String) -> Value {
    json!({"content":[{"type":"text","text":t}]})
}

async fn run_tool(c: &CallCtx) -> Result<Value, Value> {
    let name = c.params.get("name").and_then(Value::as_str).unwrap_or("");
    match name {
        "echo" => Ok(text(
            c.arg("text")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
        )),
        "progress" => {
            let steps = c.arg("steps").and_then(Value::as_u64).unwrap_or(3);
            if let Some(token) = c.params.get("_meta").and_then(|m| m.get("progressToken")) {
                for i in 1..=steps {
                    c.notify(
                        "notifications/progress",
                        json!({"progressToken":token,"progress":i,"total":steps}),
                    )
                    .await;
                }
            }
            Ok(text(format!("done after {steps} steps")))
        }
        "ask_name" => Ok(text(format!(
            "Hello, {}!",
            c.elicit_name("What is your name?").await?
        ))),
        "summarize" => {
            let input = c.arg("text").and_then(Value::as_str).unwrap_or("");
            Ok(text(format!("Summary: {}", c.sample(input).await?)))
        }
        "list_roots" => Ok(text(format!("Roots: {}", c.roots().await?))),
        "everything" => {
            let (n, s, r) = tokio::join!(c.elicit_name("Name?"), c.sample("everything"), c.roots());
            Ok(text(format!("name={} sample={} roots={}", n?, s?, r?)))
        }
        "twice" => {
            let a = c.elicit_name("First name?").await?;
            let b = c.elicit_name("Second name?").await?;
            Ok(text(format!("{a} and {b}")))
        }
        other => Err(json!({"code": -32602, "message": format!("Unknown tool: {other}")})),
    }
}

async fn prompt(c: &CallCtx) -> Result<Value, Value> {
    match c.params.get("name").and_then(Value::as_str) {
        Some("greeting") => {
            let name = c.elicit_name("Who should be greeted?").await?;
            Ok(
                json!({"messages":[{"role":"user","content":{"type":"text","text":format!("Please greet {name}.")}}]}),
            )
        }
        _ => Err(json!({"code": -32602, "message": "Unknown prompt"})),
    }
}

async fn read(c: &CallCtx) -> Result<Value, Value> {
    match c.params.get("uri").and_then(Value::as_str) {
        Some("demo://motd") => Ok(
            json!({"contents":[{"uri":"demo://motd","mimeType":"text/plain","text":"Have a nice day"}]}),
        ),
        Some("demo://secret") => {
            let name = c.elicit_name("Who is asking?").await?;
            Ok(
                json!({"contents":[{"uri":"demo://secret","mimeType":"text/plain","text":format!("secret for {name}")}]}),
            )
        }
        Some(uri) => Err(json!({"code": -32002, "message": format!("Resource not found: {uri}")})),
        None => Err(json!({"code": -32602, "message": "missing uri"})),
    }
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
