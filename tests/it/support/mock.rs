//! A scripted legacy upstream (hyper on 127.0.0.1:0). `initialize`, sessions, GET streams and
//! DELETE behave like the official SDKs; each tool runs a script of steps. Everything POSTed is
//! recorded, and tests wait on it with [`Mock::wait_for`] (an event, not a sleep).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use mrtr_proxy::body::{empty, full, Body, ChannelBody};
use mrtr_proxy::sse::encode_message;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};

/// One step of a tool script.
#[derive(Debug, Clone)]
pub enum Step {
    /// Emit a message on the call's SSE stream (a request registers a waiter for its id).
    Send(Value),
    /// Emit a message on the session's GET stream.
    SendOnGet(Value),
    /// Wait for the client's answer to server request `id`.
    Await(i64),
    /// Finish with this result.
    Reply(Value),
    /// Finish with this JSON-RPC error.
    Error(Value),
    /// Drop the call stream without a result (the server died).
    Die,
    /// Pause (server-side behaviour, e.g. a slow tool).
    Delay(u64),
    /// Never finish.
    Hang,
    /// Emit these bytes on the call's SSE stream as they are (garbage, half an event).
    Raw(&'static str),
    /// Emit one SSE event whose data is this text, every `{id}` in it replaced by the call's
    /// JSON-RPC id (its JSON text).
    EventWithId(&'static str),
    /// As the first step: answer the call's POST with this HTTP status instead of a stream
    /// (a `Location` to the mock's own `/redirected` path for a 3xx).
    Status(u16),
}

impl Step {
    /// An `elicitation/create` with server-request id `id` and an empty form.
    pub fn elicit(id: i64) -> Self {
        Self::Send(serde_json::json!({
            "jsonrpc": "2.0", "id": id, "method": "elicitation/create",
            "params": {"message": "n", "requestedSchema": {"type": "object", "properties": {}}}
        }))
    }
}

#[derive(Default)]
struct State {
    scripts: Mutex<HashMap<String, Vec<Vec<Step>>>>,
    calls: Mutex<HashMap<String, usize>>,
    posted: Mutex<Vec<Value>>,
    // The request headers of each POSTed message (same order as `posted`).
    posted_headers: Mutex<Vec<(Value, http::HeaderMap)>>,
    paths: Mutex<Vec<String>>,
    // The request target (path and query) of every request, as it came.
    targets: Mutex<Vec<String>>,
    // Method, path and headers of every request (GET streams and DELETEs included).
    requests: Mutex<Vec<(Method, String, http::HeaderMap)>>,
    // (session, message) of every answer to a server request, for `Step::Await`.
    answers: Mutex<Vec<(String, Value)>>,
    deleted: Mutex<Vec<String>>,
    initialized: Mutex<Vec<Value>>,
    // The client capabilities each session's `initialize` declared, by session id.
    session_caps: Mutex<HashMap<String, Value>>,
    // The server capabilities `initialize` answers with, when set.
    server_caps: Mutex<Option<Value>>,
    changed: Notify,
    get_streams: Mutex<HashMap<String, mpsc::Sender<Bytes>>>,
    sessions: Mutex<HashMap<String, ()>>,
    counter: AtomicU64,
    json_mode: std::sync::atomic::AtomicBool,
    // `Authorization` every request must carry, if set.
    required_auth: Mutex<Option<String>>,
    // Longest `Authorization` accepted (431 above it), if set.
    max_auth_len: Mutex<Option<usize>>,
    // Answer `initialize` with headers, then never send the body (the senders are kept here).
    stall_initialize: std::sync::atomic::AtomicBool,
    stalled: Mutex<Vec<mpsc::Sender<Bytes>>>,
}

/// What the mock answers a request without the required credentials.
pub const CHALLENGE: &str =
    r#"Bearer resource_metadata="http://mock/.well-known/oauth-protected-resource/mcp""#;

/// The mock upstream; stops on drop.
pub struct Mock {
    addr: std::net::SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Mock {
    pub async fn start() -> Self {
        Self::start_at("127.0.0.1:0".parse().unwrap()).await
    }

    /// Starts on `addr` (e.g. the address of a mock that was stopped, to bring "it" back).
    pub async fn start_at(addr: std::net::SocketAddr) -> Self {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        let st = Arc::clone(&state);
        let task = mrtr_proxy::demo::upstream::serve(listener, st, handle);
        Self { addr, state, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// Sets the scripts of `tool`: the n-th call runs `scripts[n]` (the last one repeats).
    pub fn script(&self, tool: &str, scripts: Vec<Vec<Step>>) {
        self.state
            .scripts
            .lock()
            .unwrap()
            .insert(tool.to_owned(), scripts);
    }

    /// From now on, refuse (401 + `WWW-Authenticate`, like the SDKs' bearer-auth middleware) any
    /// MCP request whose `Authorization` is not `auth`.
    pub fn require_auth(&self, auth: &str) {
        *self.state.required_auth.lock().unwrap() = Some(auth.to_owned());
    }

    /// From now on, refuse with 431 (as HTTP servers do for oversized headers) any request whose
    /// `Authorization` is longer than `len` bytes.
    pub fn max_auth_len(&self, len: usize) {
        *self.state.max_auth_len.lock().unwrap() = Some(len);
    }

    /// From now on, answer `initialize` with its response headers and then silence: the body
    /// never comes and the connection stays open.
    pub fn stall_initialize(&self) {
        self.state
            .stall_initialize
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many `initialize` requests were stalled so far.
    pub fn stalled(&self) -> usize {
        self.state.stalled.lock().unwrap().len()
    }

    /// Answer plain JSON (not SSE) to requests.
    pub fn json_mode(&self) {
        self.state.json_mode.store(true, Ordering::Relaxed);
    }

    /// Emits a message on every open GET stream.
    pub async fn broadcast_on_get(&self, msg: Value) {
        let streams: Vec<_> = self
            .state
            .get_streams
            .lock()
            .unwrap()
            .values()
            .cloned()
            .collect();
        for s in streams {
            let _ = s.send(encode_message(msg.to_string().as_bytes())).await;
        }
    }

    /// Forgets every session (the next request on one gets 404).
    pub fn forget_sessions(&self) {
        self.state.sessions.lock().unwrap().clear();
    }

    /// The path of every request the mock got, in order.
    pub fn paths(&self) -> Vec<String> {
        self.state.paths.lock().unwrap().clone()
    }

    /// The request target (path and query, as sent) of every request the mock got, in order.
    pub fn targets(&self) -> Vec<String> {
        self.state.targets.lock().unwrap().clone()
    }

    pub fn posted(&self) -> Vec<Value> {
        self.state.posted.lock().unwrap().clone()
    }

    /// Method, path and headers of every request the mock got, in order.
    pub fn requests(&self) -> Vec<(Method, String, http::HeaderMap)> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Every POSTed message with the request headers it came with, in order.
    pub fn posted_with_headers(&self) -> Vec<(Value, http::HeaderMap)> {
        self.state.posted_headers.lock().unwrap().clone()
    }

    pub fn initialized(&self) -> Vec<Value> {
        self.state.initialized.lock().unwrap().clone()
    }

    /// From now on, `initialize` answers with these server capabilities.
    pub fn declare(&self, capabilities: Value) {
        *self.state.server_caps.lock().unwrap() = Some(capabilities);
    }

    /// For every POSTed `method`, in order: the client capabilities the `initialize` of the
    /// session it ran on declared.
    pub fn sessions_serving(&self, method: &str) -> Vec<Value> {
        let caps = self.state.session_caps.lock().unwrap();
        self.posted_with_headers()
            .iter()
            .filter(|(m, _)| m["method"] == method)
            .map(|(_, h)| {
                let sid = h["mcp-session-id"].to_str().unwrap();
                caps.get(sid).cloned().expect("a session the mock opened")
            })
            .collect()
    }

    pub fn deleted(&self) -> Vec<String> {
        self.state.deleted.lock().unwrap().clone()
    }

    /// Waits (bounded) until `n` POSTed messages match `pred`.
    pub async fn wait_for_n(&self, what: &str, n: usize, pred: impl Fn(&Value) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let notified = self.state.changed.notified();
            if self
                .state
                .posted
                .lock()
                .unwrap()
                .iter()
                .filter(|v| pred(v))
                .count()
                >= n
            {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!(
                    "upstream never received {n} of {what}; got {:#?}",
                    self.posted()
                );
            }
        }
    }

    /// Waits (bounded) until a POSTed message matches `pred`; returns it.
    pub async fn wait_for(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let notified = self.state.changed.notified();
            if let Some(v) = self
                .state
                .posted
                .lock()
                .unwrap()
                .iter()
                .find(|v| pred(v))
                .cloned()
            {
                return v;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!("upstream never received {what}; got {:#?}", self.posted());
            }
        }
    }

    /// Waits (bounded) until at least `n` sessions were DELETEd.
    pub async fn wait_deleted(&self, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let notified = self.state.changed.notified();
            if self.deleted().len() >= n {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!(
                    "only {} sessions were deleted, wanted {n}",
                    self.deleted().len()
                );
            }
        }
    }

    /// Messages answering server request `id`.
    pub fn answers_to(&self, id: i64) -> Vec<Value> {
        self.posted()
            .into_iter()
            .filter(|m| m.get("method").is_none() && m["id"] == id)
            .collect()
    }

    /// How often `tools/call` of `tool` arrived.
    pub fn calls_of(&self, tool: &str) -> usize {
        self.state
            .calls
            .lock()
            .unwrap()
            .get(tool)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(st: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    st.paths.lock().unwrap().push(req.uri().path().to_owned());
    let target = req.uri().path_and_query().map_or("", |p| p.as_str());
    st.targets.lock().unwrap().push(target.to_owned());
    st.requests.lock().unwrap().push((
        req.method().clone(),
        req.uri().path().to_owned(),
        req.headers().clone(),
    ));
    if req.uri().path() == "/.well-known/oauth-protected-resource/mcp" {
        let mut r = Response::new(full(
            json!({"resource":"http://mock/mcp","authorization_servers":["http://auth.example"]})
                .to_string(),
        ));
        r.headers_mut()
            .insert("content-type", HeaderValue::from_static("application/json"));
        return r;
    }
    let max_auth = *st.max_auth_len.lock().unwrap();
    let auth_len = req.headers().get("authorization").map_or(0, |v| v.len());
    if max_auth.is_some_and(|max| auth_len > max) {
        let mut r = Response::new(empty());
        *r.status_mut() = StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE;
        return r;
    }
    let required = st.required_auth.lock().unwrap().clone();
    if let Some(required) = required {
        let given = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if given != Some(required.as_str()) {
            let mut r = Response::new(full(r#"{"error":"invalid_token"}"#));
            *r.status_mut() = StatusCode::UNAUTHORIZED;
            r.headers_mut()
                .insert("content-type", HeaderValue::from_static("application/json"));
            r.headers_mut()
                .insert("www-authenticate", HeaderValue::from_static(CHALLENGE));
            return r;
        }
    }
    let sid = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let known = sid
        .as_ref()
        .is_some_and(|s| st.sessions.lock().unwrap().contains_key(s));
    match *req.method() {
        Method::GET if known => {
            let (tx, body) = ChannelBody::channel(16);
            st.get_streams
                .lock()
                .unwrap()
                .insert(sid.unwrap_or_default(), tx);
            sse(body)
        }
        Method::GET => status(StatusCode::NOT_FOUND),
        Method::DELETE => {
            if let Some(s) = sid {
                st.sessions.lock().unwrap().remove(&s);
                st.get_streams.lock().unwrap().remove(&s);
                st.deleted.lock().unwrap().push(s);
                st.changed.notify_waiters();
            }
            status(StatusCode::OK)
        }
        Method::POST => {
            let headers = req.headers().clone();
            let bytes = req.into_body().collect().await.unwrap().to_bytes();
            let msg: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            st.posted_headers
                .lock()
                .unwrap()
                .push((msg.clone(), headers));
            st.posted.lock().unwrap().push(msg.clone());
            st.changed.notify_waiters();
            post(st, sid, known, msg).await
        }
        _ => status(StatusCode::METHOD_NOT_ALLOWED),
    }
}

async fn post(st: Arc<State>, sid: Option<String>, known: bool, msg: Value) -> Response<Body> {
    let method = msg["method"].as_str().unwrap_or("").to_owned();
    if method == "initialize" && st.stall_initialize.load(Ordering::Relaxed) {
        let (tx, body) = ChannelBody::channel(1);
        st.stalled.lock().unwrap().push(tx);
        st.changed.notify_waiters();
        let mut r = Response::new(body);
        r.headers_mut().insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        return r;
    }
    if method == "initialize" {
        let id = format!("mock-{}", st.counter.fetch_add(1, Ordering::Relaxed));
        st.sessions.lock().unwrap().insert(id.clone(), ());
        st.initialized.lock().unwrap().push(msg["params"].clone());
        let declared = msg["params"]["capabilities"].clone();
        st.session_caps.lock().unwrap().insert(id.clone(), declared);
        let caps = st.server_caps.lock().unwrap().clone().unwrap_or_else(
            || json!({"tools":{"listChanged":true},"resources":{"subscribe":true}}),
        );
        let result = json!({"protocolVersion":"2025-11-25","capabilities":caps,"serverInfo":{"name":"mock","version":"1"}});
        let mut r = Response::new(full(
            json!({"jsonrpc":"2.0","id":msg["id"],"result":result}).to_string(),
        ));
        r.headers_mut()
            .insert("content-type", HeaderValue::from_static("application/json"));
        r.headers_mut()
            .insert("mcp-session-id", HeaderValue::from_str(&id).unwrap());
        return r;
    }
    if !known {
        let code = if sid.is_some() {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::BAD_REQUEST
        };
        return status(code);
    }
    if method.is_empty() {
        st.answers
            .lock()
            .unwrap()
            .push((sid.unwrap_or_default(), msg));
        st.changed.notify_waiters();
        return status(StatusCode::ACCEPTED);
    }
    if msg.get("id").is_none() {
        return status(StatusCode::ACCEPTED);
    }
    let id = msg["id"].clone();
    let reply = move |result: Value| json!({"jsonrpc":"2.0","id":id,"result":result});
    let id = msg["id"].clone();
    let script = match method.as_str() {
        "tools/call" => {
            let name = msg["params"]["name"].as_str().unwrap_or("").to_owned();
            let n = {
                let mut calls = st.calls.lock().unwrap();
                let c = calls.entry(name.clone()).or_insert(0);
                *c += 1;
                *c - 1
            };
            let scripts = st.scripts.lock().unwrap().get(&name).cloned();
            match scripts {
                Some(s) if !s.is_empty() => s[n.min(s.len() - 1)].clone(),
                _ => vec![Step::Reply(
                    json!({"content":[{"type":"text","text":format!("ran {name}")}]}),
                )],
            }
        }
        "tools/list" => vec![Step::Reply(json!({"tools":[
            {"name":"t","inputSchema":{"type":"object"},"execution":{"taskSupport":"optional"}},
            {"name":"look","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}},
            {"name":"put","inputSchema":{"type":"object"},"annotations":{"idempotentHint":true,"readOnlyHint":false}},
            {"name":"ask","inputSchema":{"type":"object"},"annotations":{"destructiveHint":true}}
        ]}))],
        "resources/read" => vec![Step::Error(
            json!({"code":-32002,"message":"Resource not found"}),
        )],
        "resources/subscribe" => vec![Step::Reply(json!({}))],
        _ => vec![Step::Reply(json!({}))],
    };
    if let Some(Step::Status(code)) = script.first() {
        let mut r = Response::new(full("upstream says no"));
        *r.status_mut() = StatusCode::from_u16(*code).unwrap();
        r.headers_mut()
            .insert("content-type", HeaderValue::from_static("text/plain"));
        r.headers_mut()
            .insert("location", HeaderValue::from_static("/redirected"));
        return r;
    }
    if st.json_mode.load(Ordering::Relaxed) {
        return json_mode_call(&st, sid.unwrap_or_default(), id, script).await;
    }
    let (tx, body) = ChannelBody::channel(16);
    let sid = sid.unwrap_or_default();
    tokio::spawn(async move {
        for step in script {
            match step {
                Step::Send(m) => {
                    if tx
                        .send(encode_message(m.to_string().as_bytes()))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Step::SendOnGet(m) => send_on_get(&st, &sid, &m).await,
                Step::Await(rid) => await_answer(&st, &sid, rid).await,
                Step::Reply(r) => {
                    let _ = tx
                        .send(encode_message(reply(r).to_string().as_bytes()))
                        .await;
                    return;
                }
                Step::Error(e) => {
                    let m = json!({"jsonrpc":"2.0","id":id,"error":e});
                    let _ = tx.send(encode_message(m.to_string().as_bytes())).await;
                    return;
                }
                Step::Die => return,
                Step::Delay(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                Step::Hang => {
                    tx.closed().await;
                    return;
                }
                Step::Raw(bytes) => {
                    if tx.send(Bytes::from_static(bytes.as_bytes())).await.is_err() {
                        return;
                    }
                }
                Step::EventWithId(text) => {
                    let data = text.replace("{id}", &id.to_string());
                    let bytes = Bytes::from(format!("data: {data}\n\n"));
                    if tx.send(bytes).await.is_err() {
                        return;
                    }
                }
                Step::Status(_) => {}
            }
        }
    });
    sse(body)
}

/// Like the SDKs in JSON-response mode: nothing can go on the call's own stream (those messages
/// are dropped), the GET stream still works, and the response, headers and all, comes only when
/// the script is done.
async fn json_mode_call(st: &State, sid: String, id: Value, script: Vec<Step>) -> Response<Body> {
    let mut last = None;
    for step in script {
        match step {
            Step::Send(_) | Step::Raw(_) | Step::EventWithId(_) | Step::Status(_) => {}
            Step::SendOnGet(m) => send_on_get(st, &sid, &m).await,
            Step::Await(rid) => await_answer(st, &sid, rid).await,
            Step::Reply(r) => {
                last = Some(json!({"jsonrpc":"2.0","id":id,"result":r}));
                break;
            }
            Step::Error(e) => {
                last = Some(json!({"jsonrpc":"2.0","id":id,"error":e}));
                break;
            }
            Step::Delay(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            Step::Die => break,
            Step::Hang => std::future::pending::<()>().await,
        }
    }
    let Some(last) = last else {
        return status(StatusCode::INTERNAL_SERVER_ERROR);
    };
    let mut resp = Response::new(full(last.to_string()));
    resp.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    resp
}

async fn send_on_get(st: &State, sid: &str, m: &Value) {
    let get = st.get_streams.lock().unwrap().get(sid).cloned();
    if let Some(g) = get {
        let _ = g.send(encode_message(m.to_string().as_bytes())).await;
    }
}

async fn await_answer(st: &State, sid: &str, id: i64) {
    loop {
        let notified = st.changed.notified();
        if answered(st, sid, id) {
            return;
        }
        notified.await;
    }
}

fn answered(st: &State, sid: &str, id: i64) -> bool {
    st.answers
        .lock()
        .unwrap()
        .iter()
        .any(|(s, m)| s == sid && m["id"] == id)
}

fn sse(body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    r
}

fn status(code: StatusCode) -> Response<Body> {
    let mut r = Response::new(empty());
    *r.status_mut() = code;
    r
}
