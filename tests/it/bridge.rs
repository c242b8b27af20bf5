//! Legacy Streamable HTTP clients (2025-11-25: `initialize` + `Mcp-Session-Id`) in front of a
//! stdio upstream (a scripted Python child, below) and an HTTP+SSE one (the built-in demo
//! server), where the proxy is the legacy server they talk to. This file holds the harness: the
//! child's script, a recorder of what every child reads, and a hand-written legacy client.
//! Each child reports every line it reads on a Unix socket, so nothing here sleeps to wait.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use mrtr_proxy::body::{empty, full, Body};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixListener;
use tokio::sync::mpsc;

use crate::support::TestProxy;

mod flows;
mod sessions;
mod sse;

/// The stdio child (standard-library Python). Tools: `pid` (its process id), `ask` (elicits a
/// name), `hang` (never answers), `die` (SIGKILLs itself mid-call), `later` (answers at once,
/// then sends `notifications/tools/list_changed` and a `roots/list` request, id 100, outside
/// any call; the answer to that comes back as a `notifications/message` carrying it). Its
/// `initialize` answer echoes the client's version and names the client in `instructions`.
/// Every line read is reported as `<pid> <line>` on `RECORD_SOCK`, then `<pid> EOF`.
const SCRIPT: &str = r#"
import json, os, signal, socket, sys
PID = os.getpid()
rec = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
rec.connect(os.environ["RECORD_SOCK"])
def note(line):
    rec.sendall(f"{PID} {line}\n".encode())
def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()
def answer(id, text):
    send({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": text}]}})
TOOLS = [{"name": n, "inputSchema": {"type": "object"}} for n in ("pid", "ask", "hang", "die", "later")]
asking = {}
next_ask = 0
for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    note(line)
    msg = json.loads(line)
    method, id = msg.get("method"), msg.get("id")
    if method is None:
        if id in asking:
            name = msg.get("result", {}).get("content", {}).get("name", "?")
            answer(asking.pop(id), f"Hello, {name}!")
        elif id == 100:
            send({"jsonrpc": "2.0", "method": "notifications/message",
                  "params": {"level": "info", "data": msg.get("result")}})
        continue
    if id is None:
        continue
    if method == "initialize":
        p = msg["params"]
        send({"jsonrpc": "2.0", "id": id, "result": {
            "protocolVersion": p["protocolVersion"], "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": "bridge-script", "version": "1"},
            "instructions": "for " + p.get("clientInfo", {}).get("name", "?")}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": id, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        name = msg["params"]["name"]
        if name == "pid":
            answer(id, str(PID))
        elif name == "ask":
            asking[next_ask] = id
            send({"jsonrpc": "2.0", "id": next_ask, "method": "elicitation/create",
                  "params": {"mode": "form", "message": "Name?", "requestedSchema": {
                      "type": "object", "properties": {"name": {"type": "string"}}}}})
            next_ask += 1
        elif name == "die":
            os.kill(PID, signal.SIGKILL)
        elif name == "later":
            answer(id, "later")
            send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
            send({"jsonrpc": "2.0", "id": 100, "method": "roots/list"})
    else:
        send({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no " + method}})
note("EOF")
"#;

/// Longest wait for anything a test waits on.
const WAIT: Duration = Duration::from_secs(10);

/// What the children read: `(pid, line)`, from every child, in arrival order.
pub struct Recorder {
    path: PathBuf,
    lines: mpsc::UnboundedReceiver<(u32, String)>,
    seen: Vec<(u32, String)>,
}

impl Recorder {
    pub fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "mrtr-bridge-{}-{}.sock",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut rd = BufReader::new(conn).lines();
                    while let Ok(Some(l)) = rd.next_line().await {
                        if let Some((pid, rest)) = l.split_once(' ') {
                            let _ = tx.send((pid.parse().unwrap(), rest.to_owned()));
                        }
                    }
                });
            }
        });
        Self {
            path,
            lines,
            seen: Vec::new(),
        }
    }

    /// The first line (seen already, or within 10 s) matching `pred`; panics naming `what`.
    pub async fn until(&mut self, what: &str, pred: impl Fn(u32, &str) -> bool) -> (u32, String) {
        if let Some(hit) = self.seen.iter().find(|(p, l)| pred(*p, l)) {
            return hit.clone();
        }
        let seen = &mut self.seen;
        let lines = &mut self.lines;
        let found = tokio::time::timeout(WAIT, async {
            while let Some((pid, line)) = lines.recv().await {
                seen.push((pid, line.clone()));
                if pred(pid, &line) {
                    return Some((pid, line));
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(hit)) => hit,
            _ => panic!("no {what}; saw {:?}", self.seen),
        }
    }

    /// The first JSON-RPC message a child read that matches `pred`.
    pub async fn message(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> (u32, Value) {
        let parse = |l: &str| serde_json::from_str::<Value>(l).unwrap_or(Value::Null);
        let (pid, line) = self.until(what, |_, l| pred(&parse(l))).await;
        (pid, parse(&line))
    }

    /// The child that read the `initialize` of client `name`, and that `initialize`.
    pub async fn child_of(&mut self, name: &str) -> (u32, Value) {
        self.message(&format!("initialize of {name}"), |m| {
            m["method"] == "initialize" && m["params"]["clientInfo"]["name"] == name
        })
        .await
    }

    /// Resolves when child `pid` read the end of its stdin.
    pub async fn eof_of(&mut self, pid: u32) {
        self.until(&format!("EOF of {pid}"), |p, l| p == pid && l == "EOF")
            .await;
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The proxy in front of the scripted stdio child; `extra` is appended to `[upstream]`.
pub async fn stdio_proxy(rec: &Recorder, extra: &str) -> TestProxy {
    let toml = format!(
        "command = [\"python3\", \"-c\", '''{SCRIPT}''']\nenv = {{ RECORD_SOCK = \"{}\" }}\n{extra}",
        rec.path.display()
    );
    TestProxy::start("http://127.0.0.1:9/unused", &toml).await
}

type Http =
    hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Body>;

/// A legacy Streamable HTTP client, by hand: its session id once initialized, and its
/// `Authorization` header (its principal) if any.
pub struct Legacy {
    http: Http,
    url: String,
    auth: Option<String>,
    pub sid: Option<String>,
    /// The `MCP-Protocol-Version` header it sends.
    pub version: String,
}

impl Legacy {
    pub fn new(proxy: &TestProxy) -> Self {
        let http =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(hyper_util::client::legacy::connect::HttpConnector::new());
        Self {
            http,
            url: proxy.url(),
            auth: None,
            sid: None,
            version: "2025-11-25".into(),
        }
    }

    /// The same client speaking for `authorization` instead.
    pub fn speaking_for(mut self, authorization: &str) -> Self {
        self.auth = Some(authorization.to_owned());
        self
    }

    /// This client with session id `sid` (another's, or a made-up one).
    pub fn with_session(&self, sid: &str) -> Self {
        Self {
            http: self.http.clone(),
            url: self.url.clone(),
            auth: self.auth.clone(),
            sid: Some(sid.to_owned()),
            version: self.version.clone(),
        }
    }

    async fn send(&self, method: Method, body: Option<&Value>) -> Response<Incoming> {
        self.send_text(method, body.map(Value::to_string)).await
    }

    async fn send_text(&self, method: Method, body: Option<String>) -> Response<Incoming> {
        let mut b = Request::builder()
            .method(method)
            .uri(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", &self.version);
        if let Some(s) = &self.sid {
            b = b.header("mcp-session-id", s);
        }
        if let Some(a) = &self.auth {
            b = b.header("authorization", a);
        }
        let req = match body {
            Some(text) => b
                .header("content-type", "application/json")
                .body(full(text)),
            None => b.body(empty()),
        };
        tokio::time::timeout(WAIT, self.http.request(req.unwrap()))
            .await
            .expect("the proxy answers within 10 s")
            .unwrap()
    }

    /// POSTs `msg`; returns the status and the body as JSON (`Null` when empty).
    pub async fn post(&self, msg: &Value) -> (StatusCode, Value) {
        let resp = self.send(Method::POST, Some(msg)).await;
        let status = resp.status();
        (status, json_body(resp).await)
    }

    /// POSTs an `initialize` as client `name` with id `id`; returns the status, the session id
    /// issued (if any) and the body. Does not keep the session id.
    pub async fn try_initialize(
        &self,
        id: Value,
        name: &str,
    ) -> (StatusCode, Option<String>, Value) {
        let params = json!({"protocolVersion": "2025-11-25",
            "capabilities": {"elicitation": {}, "roots": {"listChanged": true}},
            "clientInfo": {"name": name, "version": "1"}});
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": params});
        self.post_initialize(msg.to_string()).await
    }

    /// POSTs `initialize` with id 0 and `params`, as this JSON text; returns the status, the
    /// session id issued (if any) and the body. Does not keep the session id.
    pub async fn initialize_with(&self, params: &str) -> (StatusCode, Option<String>, Value) {
        let text = format!(r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{params}}}"#);
        self.post_initialize(text).await
    }

    async fn post_initialize(&self, text: String) -> (StatusCode, Option<String>, Value) {
        let resp = self.send_text(Method::POST, Some(text)).await;
        let status = resp.status();
        let sid = resp
            .headers()
            .get("mcp-session-id")
            .map(|v| v.to_str().unwrap().to_owned());
        (status, sid, json_body(resp).await)
    }

    /// Initializes as client `name` (asserting 200 and a session id, which it keeps), then
    /// sends `notifications/initialized` (asserting 202); returns the `initialize` answer.
    pub async fn initialize(&mut self, name: &str) -> Value {
        let (status, sid, body) = self.try_initialize(json!(0), name).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        self.sid = Some(sid.expect("a session id is issued"));
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        assert_eq!(self.post(&note).await.0, StatusCode::ACCEPTED);
        body
    }

    /// POSTs request `method(params)` with id `id`; returns its SSE stream (asserting 200).
    pub async fn request(&self, id: Value, method: &str, params: Value) -> Stream {
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let resp = self.send(Method::POST, Some(&msg)).await;
        assert_eq!(resp.status(), StatusCode::OK, "{method}");
        Stream::of(resp)
    }

    /// Calls tool `name` with id `id`; returns the call's SSE stream.
    pub async fn call(&self, id: Value, name: &str) -> Stream {
        let params = json!({"name": name, "arguments": {}});
        self.request(id, "tools/call", params).await
    }

    /// Calls tool `name` and returns its answer, the last message of its stream.
    pub async fn call_answer(&self, id: Value, name: &str) -> Value {
        self.call(id, name).await.last().await
    }

    /// Opens the GET stream.
    pub async fn get(&self) -> Response<Incoming> {
        self.send(Method::GET, None).await
    }

    pub async fn delete(&self) -> StatusCode {
        self.send(Method::DELETE, None).await.status()
    }

    /// Asserts that POST, GET and DELETE on this session id all get 404.
    pub async fn assert_unknown(&self) {
        let list = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"});
        let (status, body) = self.post(&list).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "POST: {body}");
        assert_eq!(self.get().await.status(), StatusCode::NOT_FOUND, "GET");
        assert_eq!(self.delete().await, StatusCode::NOT_FOUND, "DELETE");
    }
}

async fn json_body(resp: Response<Incoming>) -> Value {
    let bytes = tokio::time::timeout(WAIT, resp.into_body().collect())
        .await
        .expect("the body ends within 10 s")
        .unwrap()
        .to_bytes();
    if bytes.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(&bytes).unwrap()
}

/// An SSE response (a request's, or the GET stream), read message by message.
pub struct Stream {
    body: Incoming,
    decoder: mrtr_proxy::sse::SseDecoder,
    queue: VecDeque<Value>,
}

impl Stream {
    pub fn of(resp: Response<Incoming>) -> Self {
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        Self {
            body: resp.into_body(),
            decoder: mrtr_proxy::sse::SseDecoder::new(1 << 20),
            queue: VecDeque::new(),
        }
    }

    /// The next message, or `None` once the stream ended; panics after 10 s.
    pub async fn next_or_end(&mut self) -> Option<Value> {
        loop {
            if let Some(v) = self.queue.pop_front() {
                return Some(v);
            }
            let frame = tokio::time::timeout(WAIT, self.body.frame())
                .await
                .expect("an event or the end within 10 s");
            let Some(Ok(frame)) = frame else {
                return None;
            };
            if let Ok(data) = frame.into_data() {
                for e in self.decoder.feed(&data).unwrap() {
                    if !e.data.is_empty() {
                        self.queue.push_back(serde_json::from_str(&e.data).unwrap());
                    }
                }
            }
        }
    }

    /// The next message; panics if the stream ends first.
    pub async fn next(&mut self) -> Value {
        self.next_or_end().await.expect("the stream is still open")
    }

    /// The last message, asserting the stream then ends (what came before is skipped).
    pub async fn last(mut self) -> Value {
        let mut last = None;
        while let Some(m) = self.next_or_end().await {
            last = Some(m);
        }
        last.expect("a message before the end")
    }

    /// Resolves when the stream ends, asserting nothing more came.
    pub async fn ended(&mut self) {
        assert_eq!(self.next_or_end().await, None);
    }
}

/// The text of a tool result's first content item.
pub fn text_of(answer: &Value) -> &str {
    answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("not a text result: {answer}"))
}
