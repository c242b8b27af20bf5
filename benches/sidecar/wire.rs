//! The exchanges the harness times, each on raw hyper HTTP/1.1 keep-alive connections (no pool,
//! no retry: one connection per worker, so a figure is one request's path and nothing else).

use std::net::SocketAddr;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use mrtr_proxy::sse::SseDecoder;
use serde_json::{json, Value};
use tokio::net::TcpStream;

/// Where an MCP endpoint is: the upstream itself, nginx in front of it, or the proxy.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    pub(crate) addr: SocketAddr,
    pub(crate) path: String,
}

impl Endpoint {
    /// From `http://127.0.0.1:PORT/path`.
    pub(crate) fn parse(url: &str) -> Self {
        let rest = url.strip_prefix("http://").expect("http url");
        let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        Self {
            addr: host.parse().expect("ip:port"),
            path: if path.is_empty() {
                "/".into()
            } else {
                path.into()
            },
        }
    }
}

/// What one timed operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exchange {
    /// A legacy `tools/call` of `echo` in a session: POST, read the result.
    LegacyCall,
    /// A legacy round: POST `ask_name`, read the inline elicitation off its SSE stream, POST the
    /// answer (second connection), read the result.
    LegacyRound,
    /// A 2026-07-28 `tools/call` of `echo` (no session).
    ModernCall,
    /// An MRTR round: `ask_name` → `input_required`, the retry with the answer → the result.
    MrtrRound,
}

/// One worker's connections to one endpoint, and its legacy session if it has one.
pub(crate) struct Client {
    ep: Endpoint,
    main: SendRequest<Full<Bytes>>,
    side: Option<SendRequest<Full<Bytes>>>,
    session: Option<String>,
    next_id: u64,
}

async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let _ = stream.set_nodelay(true);
    let (tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    tx
}

/// Waits until `conn` can take a request; a connection the server closed while it sat idle
/// (its keep-alive timeout ran out while other targets were measured) is opened again, as any
/// client would.
async fn ready(conn: &mut SendRequest<Full<Bytes>>, addr: SocketAddr) {
    if conn.ready().await.is_err() {
        *conn = connect(addr).await;
    }
}

impl Client {
    /// Opens the connections `ex` needs; `session` is the legacy session to call in.
    pub(crate) async fn open(ep: &Endpoint, ex: Exchange, session: Option<String>) -> Self {
        let side = if ex == Exchange::LegacyRound {
            Some(connect(ep.addr).await)
        } else {
            None
        };
        Self {
            ep: ep.clone(),
            main: connect(ep.addr).await,
            side,
            session,
            next_id: 1,
        }
    }

    /// Runs one exchange to its end; panics on any wrong answer (a benchmark of errors is not
    /// a benchmark).
    pub(crate) async fn run(&mut self, ex: Exchange) {
        match ex {
            Exchange::LegacyCall => self.legacy_call().await,
            Exchange::LegacyRound => self.legacy_round().await,
            Exchange::ModernCall => self.modern_call().await,
            Exchange::MrtrRound => self.mrtr_round().await,
        }
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn request(&self, body: Value, modern: Option<&str>) -> Request<Full<Bytes>> {
        let mut b = Request::post(&self.ep.path)
            .header("host", self.ep.addr.to_string())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        match modern {
            Some(name) => {
                b = b
                    .header("mcp-protocol-version", "2026-07-28")
                    .header("mcp-method", "tools/call")
                    .header("mcp-name", name);
            }
            None => {
                b = b.header("mcp-protocol-version", "2025-11-25");
                if let Some(s) = &self.session {
                    b = b.header("mcp-session-id", s);
                }
            }
        }
        b.body(Full::new(Bytes::from(body.to_string())))
            .expect("request")
    }

    async fn send(&mut self, req: Request<Full<Bytes>>) -> http::Response<Incoming> {
        ready(&mut self.main, self.ep.addr).await;
        self.main.send_request(req).await.expect("response")
    }

    /// Opens a legacy session (initialize + initialized); returns its id.
    pub(crate) async fn initialize(&mut self) -> String {
        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{}},"clientInfo":{"name":"bench","version":"0"}}});
        let resp = self.send(self.request(init, None)).await;
        let sid = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .expect("a session id")
            .to_owned();
        let _ = resp.into_body().collect().await;
        self.session = Some(sid.clone());
        let note = json!({"jsonrpc":"2.0","method":"notifications/initialized"});
        let resp = self.send(self.request(note, None)).await;
        let _ = resp.into_body().collect().await;
        sid
    }

    async fn legacy_call(&mut self) {
        let body = json!({"jsonrpc":"2.0","id":self.id(),"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}});
        let resp = self.send(self.request(body, None)).await;
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        assert!(contains(&bytes, b"\"result\""), "{bytes:?}");
    }

    async fn legacy_round(&mut self) {
        let body = json!({"jsonrpc":"2.0","id":self.id(),"method":"tools/call","params":{"name":"ask_name","arguments":{}}});
        let mut stream = self.send(self.request(body, None)).await.into_body();
        let mut dec = SseDecoder::new(1 << 20);
        loop {
            let frame = stream.frame().await.expect("a frame").expect("body");
            let Ok(data) = frame.into_data() else {
                continue;
            };
            for ev in dec.feed(&data).expect("sse") {
                let msg: Value = serde_json::from_str(&ev.data).expect("json");
                if msg["method"] == "elicitation/create" {
                    let answer = json!({"jsonrpc":"2.0","id":msg["id"],"result":{"action":"accept","content":{"name":"B"}}});
                    let req = self.request(answer, None);
                    let side = self.side.as_mut().expect("a second connection");
                    ready(side, self.ep.addr).await;
                    let resp = side.send_request(req).await.expect("answer");
                    let _ = resp.into_body().collect().await;
                } else if msg.get("result").is_some() {
                    assert_eq!(msg["result"]["content"][0]["text"], "Hello, B!");
                    // Read the stream to its end so the connection is free for the next call.
                    while stream.frame().await.is_some() {}
                    return;
                }
            }
        }
    }

    fn modern_params(mut params: Value) -> Value {
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
            "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
        });
        params
    }

    async fn modern(&mut self, name: &str, params: Value) -> Value {
        let body = json!({"jsonrpc":"2.0","id":self.id(),"method":"tools/call","params":Self::modern_params(params)});
        let resp = self.send(self.request(body, Some(name))).await;
        let sse = resp
            .headers()
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        let text = if sse {
            let events = SseDecoder::new(1 << 20).feed(&bytes).expect("sse");
            events.last().expect("an event").data.clone()
        } else {
            String::from_utf8(bytes.to_vec()).expect("utf-8")
        };
        let msg: Value = serde_json::from_str(&text).expect("json");
        msg.get("result")
            .cloned()
            .unwrap_or_else(|| panic!("{msg}"))
    }

    async fn modern_call(&mut self) {
        let r = self
            .modern("echo", json!({"name":"echo","arguments":{"text":"x"}}))
            .await;
        assert_eq!(r["resultType"], "complete", "{r}");
    }

    /// The first half of an MRTR round: the call parks; returns its requestState.
    pub(crate) async fn park(&mut self) -> String {
        let r = self
            .modern("ask_name", json!({"name":"ask_name","arguments":{}}))
            .await;
        assert_eq!(r["resultType"], "input_required", "{r}");
        r["requestState"].as_str().expect("requestState").to_owned()
    }

    /// The second half of an MRTR round: the retry with the answer and `state` → the result.
    pub(crate) async fn resume(&mut self, state: &str) {
        let params = json!({"name":"ask_name","arguments":{},"requestState":state,
            "inputResponses":{"elicitation-1":{"action":"accept","content":{"name":"B"}}}});
        let r = self.modern("ask_name", params).await;
        assert_eq!(r["content"][0]["text"], "Hello, B!", "{r}");
    }

    async fn mrtr_round(&mut self) {
        let state = self.park().await;
        self.resume(&state).await;
    }

    /// A GET of `path` on this endpoint's address (the proxy's /metrics): the body as text.
    pub(crate) async fn get_text(&mut self, path: &str) -> String {
        let req = Request::get(path)
            .header("host", self.ep.addr.to_string())
            .body(Full::new(Bytes::new()))
            .expect("request");
        let resp = self.send(req).await;
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
