//! An HTTP+SSE upstream, scripted: found from its URL alone (a POSTed `initialize` gets 405),
//! CRLF events between keep-alive comments, an endpoint on another origin refused, and a GET
//! stream that closes while a call is parked.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use mrtr_proxy::body::{empty, Body, ChannelBody};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::support::{all_caps, error_of, first_key, first_round, retry, TestProxy};

#[derive(Default)]
struct State {
    /// What the `endpoint` event says (default: the mock's own `/messages`).
    endpoint: Mutex<Option<String>>,
    /// Every session's GET stream, by session id.
    streams: Mutex<HashMap<u64, mpsc::Sender<Bytes>>>,
    sessions: AtomicU64,
    /// (path, message) of every POST.
    posted: Mutex<Vec<(String, Value)>>,
    /// The call an elicitation is pending for.
    asking: Mutex<Option<Value>>,
}

struct SseMock {
    addr: std::net::SocketAddr,
    st: Arc<State>,
    _task: tokio::task::JoinHandle<()>,
}

impl SseMock {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let st = Arc::new(State::default());
        let task = mrtr_proxy::demo::upstream::serve(listener, Arc::clone(&st), handle);
        Self {
            addr,
            st,
            _task: task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/sse", self.addr)
    }

    fn posted_to(&self, path: &str) -> Vec<Value> {
        let posted = self.st.posted.lock().unwrap();
        posted
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, m)| m.clone())
            .collect()
    }

    /// Ends every GET stream (each session dies with its own).
    fn close_streams(&self) {
        self.st.streams.lock().unwrap().clear();
    }
}

async fn send(st: &State, session: u64, msg: Value) {
    let tx = st.streams.lock().unwrap().get(&session).cloned();
    if let Some(tx) = tx {
        let event = format!(": ping\r\n\r\nevent: message\r\ndata: {msg}\r\n\r\n");
        let _ = tx.send(Bytes::from(event)).await;
    }
}

async fn handle(st: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/sse") => {
            let (tx, body) = ChannelBody::channel(16);
            let n = st.sessions.fetch_add(1, Ordering::Relaxed);
            let endpoint = st
                .endpoint
                .lock()
                .unwrap()
                .clone()
                .unwrap_or_else(|| format!("/messages?session_id={n}"));
            let _ = tx
                .send(Bytes::from(format!(
                    ": hello\r\n\r\nevent: endpoint\r\ndata: {endpoint}\r\n\r\n"
                )))
                .await;
            st.streams.lock().unwrap().insert(n, tx);
            let mut r = Response::new(body);
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/event-stream"),
            );
            r
        }
        (Method::POST, _) => {
            let query = req.uri().query().unwrap_or("").to_owned();
            let bytes = req.into_body().collect().await.unwrap().to_bytes();
            let msg: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            st.posted.lock().unwrap().push((path.clone(), msg.clone()));
            if path == "/sse" {
                return status(StatusCode::METHOD_NOT_ALLOWED);
            }
            let session = req_session(&query);
            on_message(&st, session, msg).await;
            status(StatusCode::ACCEPTED)
        }
        _ => status(StatusCode::NOT_FOUND),
    }
}

// initialize → its result; `ask` → an elicitation (id 0, as an SDK's first server request);
// the answer to it → the call's result. All on the GET stream.
async fn on_message(st: &State, session: u64, msg: Value) {
    let id = msg["id"].clone();
    match msg["method"].as_str() {
        Some("initialize") => {
            let result = json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                "serverInfo": {"name": "scripted-sse", "version": "1"}});
            send(
                st,
                session,
                json!({"jsonrpc": "2.0", "id": id, "result": result}),
            )
            .await;
        }
        Some("tools/list") => {
            let result = json!({"tools": [{"name": "ask", "inputSchema": {"type": "object"}}]});
            send(
                st,
                session,
                json!({"jsonrpc": "2.0", "id": id, "result": result}),
            )
            .await;
        }
        Some("tools/call") => {
            *st.asking.lock().unwrap() = Some(id);
            let schema = json!({"type": "object", "properties": {"name": {"type": "string"}}});
            let params = json!({"mode": "form", "message": "Name?", "requestedSchema": schema});
            send(st, session, json!({"jsonrpc": "2.0", "id": 0, "method": "elicitation/create", "params": params})).await;
        }
        None if id == json!(0) => {
            let call = st.asking.lock().unwrap().take();
            let name = msg["result"]["content"]["name"].as_str().unwrap_or("?");
            let result = json!({"content": [{"type": "text", "text": format!("Hello, {name}!")}]});
            send(
                st,
                session,
                json!({"jsonrpc": "2.0", "id": call, "result": result}),
            )
            .await;
        }
        _ => {}
    }
}

fn req_session(query: &str) -> u64 {
    query
        .strip_prefix("session_id=")
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX)
}

fn status(code: StatusCode) -> Response<Body> {
    let mut r = Response::new(empty());
    *r.status_mut() = code;
    r
}

fn answer_name(r: &Value) -> Value {
    let key = first_key(r);
    json!({ key: {"action": "accept", "content": {"name": "Ada"}} })
}

#[tokio::test]
async fn an_sse_upstream_is_found_from_its_url_and_serves_a_round() {
    let up = SseMock::start().await;
    let p = TestProxy::start(&up.url(), "").await;
    let c = p.client(all_caps());
    let (r, state) = first_round(&c, "ask", json!({})).await;
    assert_eq!(r["inputRequests"].as_object().unwrap().len(), 1, "{r}");
    let done = retry(&c, "ask", json!({}), answer_name(&r), &state).await;
    assert_eq!(done.result()["content"][0]["text"], "Hello, Ada!");
    // A POSTed initialize was refused (405) before the GET; everything else went to /messages.
    assert_eq!(up.posted_to("/sse")[0]["method"], "initialize");
    let methods: Vec<Value> = up
        .posted_to("/messages")
        .iter()
        .map(|m| m["method"].clone())
        .collect();
    assert!(methods.contains(&json!("tools/call")), "{methods:?}");
    assert!(
        methods.contains(&json!("notifications/initialized")),
        "{methods:?}"
    );
}

#[tokio::test]
async fn an_endpoint_on_another_origin_is_refused() {
    let up = SseMock::start().await;
    *up.st.endpoint.lock().unwrap() = Some("http://127.0.0.2:9/messages?session_id=1".into());
    let p = TestProxy::start(&up.url(), "transport = \"sse\"\n").await;
    let ex = p
        .client(all_caps())
        .request("tools/call", json!({"name": "ask", "arguments": {}}))
        .await
        .unwrap();
    let msg = error_of(&ex)["message"].as_str().unwrap().to_owned();
    assert!(msg.contains("another origin"), "{msg}");
    assert_eq!(ex.status, StatusCode::BAD_GATEWAY);
    // Nothing was sent anywhere: `transport = "sse"` does not POST initialize to the URL.
    assert!(up.st.posted.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_parked_call_whose_stream_closes_ends_with_an_upstream_error() {
    let up = SseMock::start().await;
    let p = TestProxy::start(&up.url(), "").await;
    let c = p.client(all_caps());
    let (r, state) = first_round(&c, "ask", json!({})).await;
    up.close_streams();
    let ex = retry(&c, "ask", json!({}), answer_name(&r), &state).await;
    let err = error_of(&ex);
    // The upstream-gone error (the call stays lost: its session died with the stream).
    assert_eq!(ex.status, StatusCode::BAD_GATEWAY);
    assert_eq!(err["code"], -32603);
    assert_eq!(
        err["message"],
        "upstream closed the stream before the result"
    );
    // The next call opens a new session (a new GET) and works.
    let (r, state) = first_round(&c, "ask", json!({})).await;
    let done = retry(&c, "ask", json!({}), answer_name(&r), &state).await;
    assert_eq!(done.result()["content"][0]["text"], "Hello, Ada!");
}

#[tokio::test]
async fn several_requests_opening_the_first_sessions_at_once_all_reach_the_sse_upstream() {
    let up = SseMock::start().await;
    let p = TestProxy::start(&up.url(), "").await;
    let c = p.client(all_caps());
    // Each opens a session of its own while the readiness probe opens one too, so detection runs
    // several times at once. (The race where one finds HTTP+SSE while another's POST is still out
    // is too narrow to hit here; the real-peer listen suite under load did hit it.)
    let lists =
        futures_util::future::join_all((0..6).map(|_| c.request("tools/list", json!({})))).await;
    for ex in lists {
        let ex = ex.unwrap();
        assert_eq!(ex.result()["tools"][0]["name"], "ask", "{:?}", ex.last);
    }
}
