//! Test support: an in-process proxy on port 0 and a scripted legacy upstream.

pub mod mock;
pub mod pki;
pub mod redis_server;

use std::sync::Arc;

use mrtr_proxy::app::App;
use mrtr_proxy::config::Config;
use mrtr_proxy::demo::client::ModernClient;
use mrtr_proxy::server;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Capabilities declaring every kind of input.
pub fn all_caps() -> Value {
    json!({"elicitation": {"form": {}, "url": {}}, "sampling": {"tools": {}}, "roots": {}})
}

/// The proxy, running in process; shut down on drop.
pub struct TestProxy {
    pub addr: std::net::SocketAddr,
    pub app: Arc<App>,
    stop: Option<oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<()>>,
}

impl TestProxy {
    /// Starts with `toml` (the upstream URL is filled in).
    pub async fn start(upstream: &str, toml: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::start_on(listener, upstream, toml)
    }

    /// Starts on `listener` (bound first, so that peers can name each other's address).
    pub fn start_on(listener: TcpListener, upstream: &str, toml: &str) -> Self {
        if std::env::var_os("TEST_LOG").is_some() {
            mrtr_proxy::ops::telemetry::init();
        }
        let text = format!("[upstream]\nurl = \"{upstream}\"\n{toml}");
        let config = Config::from_toml_str(&text).expect("test config");
        let addr = listener.local_addr().unwrap();
        let app = App::new(config).expect("test keys");
        let (tx, rx) = oneshot::channel::<()>();
        let served = tokio::spawn(server::run(listener, Arc::clone(&app), async move {
            let _ = rx.await;
        }));
        Self {
            addr,
            app,
            stop: Some(tx),
            served: Some(served),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    pub fn client(&self, caps: Value) -> ModernClient {
        ModernClient::new(self.url(), caps)
    }
}

impl TestProxy {
    /// Signals shutdown (as SIGTERM would); the proxy keeps serving while it drains.
    pub fn begin_shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }

    /// Resolves when the whole shutdown sequence is over; panics after 30 s.
    pub async fn stopped(&mut self) {
        self.begin_shutdown();
        if let Some(served) = self.served.take() {
            tokio::time::timeout(std::time::Duration::from_secs(30), served)
                .await
                .expect("the proxy shuts down within 30 s")
                .unwrap();
        }
    }

    /// GETs an admin route; returns its body (panics on a status other than 200).
    pub async fn get_text(&self, path: &str) -> String {
        let resp = self.get(path).await;
        assert_eq!(resp.status(), http::StatusCode::OK, "GET {path}");
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    }

    /// GETs an admin route; returns its status.
    pub async fn get_status(&self, path: &str) -> http::StatusCode {
        self.get(path).await.status()
    }

    async fn get(&self, path: &str) -> http::Response<hyper::body::Incoming> {
        let http =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<mrtr_proxy::body::Body>();
        let uri = format!("http://{}{path}", self.addr);
        let req = http::Request::get(uri)
            .body(mrtr_proxy::body::empty())
            .unwrap();
        http.request(req).await.unwrap()
    }
}

impl Drop for TestProxy {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// Runs a first call that must come back `input_required`; returns (result, requestState).
pub async fn first_round(client: &ModernClient, name: &str, args: Value) -> (Value, String) {
    let ex = client
        .request("tools/call", json!({"name": name, "arguments": args}))
        .await
        .unwrap();
    let r = ex.result().clone();
    assert_eq!(r["resultType"], "input_required", "{:?}", ex.last);
    let state = r["requestState"].as_str().unwrap().to_owned();
    (r, state)
}

/// The (first) key of a round's `inputRequests`.
pub fn first_key(round: &Value) -> String {
    round["inputRequests"]
        .as_object()
        .and_then(|m| m.keys().next())
        .expect("a round has inputRequests")
        .clone()
}

/// A retry of `name(args)` with `answers` and `state`.
pub async fn retry(
    client: &ModernClient,
    name: &str,
    args: Value,
    answers: Value,
    state: &str,
) -> mrtr_proxy::demo::client::Exchange {
    let params =
        json!({"name": name, "arguments": args, "inputResponses": answers, "requestState": state});
    client.request("tools/call", params).await.unwrap()
}

/// The error object of an exchange (panics if it was not an error).
pub fn error_of(ex: &mrtr_proxy::demo::client::Exchange) -> &Value {
    assert!(
        ex.last.get("error").is_some(),
        "expected an error, got {:?}",
        ex.last
    );
    &ex.last["error"]
}

/// An open `subscriptions/listen` stream, read event by event.
pub struct Listener {
    body: hyper::body::Incoming,
    decoder: mrtr_proxy::sse::SseDecoder,
    queue: std::collections::VecDeque<Value>,
}

impl Listener {
    /// Opens a listen stream with `filter` as `principal` (an `Authorization` value, if any).
    pub async fn open(proxy: &TestProxy, id: &str, filter: Value, principal: Option<&str>) -> Self {
        Self::declaring(proxy, id, filter, principal, json!({})).await
    }

    /// Opens a listen stream whose request declares client capabilities `caps`.
    pub async fn declaring(
        proxy: &TestProxy,
        id: &str,
        filter: Value,
        principal: Option<&str>,
        caps: Value,
    ) -> Self {
        match Self::try_declaring(proxy, id, filter, principal, caps).await {
            Ok(listener) => listener,
            Err((status, body)) => panic!("the listen was refused: {status} {body}"),
        }
    }

    /// As [`Listener::declaring`]; a refusal gives its status and body.
    pub async fn try_declaring(
        proxy: &TestProxy,
        id: &str,
        filter: Value,
        principal: Option<&str>,
        caps: Value,
    ) -> Result<Self, (http::StatusCode, Value)> {
        let body = json!({"jsonrpc":"2.0","id":id,"method":"subscriptions/listen","params":{"notifications":filter,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":caps}}});
        let http =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build::<_, mrtr_proxy::body::Body>(
                hyper_util::client::legacy::connect::HttpConnector::new(),
            );
        let mut req = http::Request::post(proxy.url())
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "subscriptions/listen")
            .header("content-type", "application/json");
        if let Some(p) = principal {
            req = req.header("authorization", p);
        }
        let req = req.body(mrtr_proxy::body::full(body.to_string())).unwrap();
        let resp = http.request(req).await.unwrap();
        if resp.headers()["content-type"] != "text/event-stream" {
            let status = resp.status();
            let body = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .unwrap()
                .to_bytes();
            return Err((status, serde_json::from_slice(&body).unwrap_or(Value::Null)));
        }
        Ok(Self {
            body: resp.into_body(),
            decoder: mrtr_proxy::sse::SseDecoder::new(1 << 20),
            queue: Default::default(),
        })
    }

    /// Resolves when the stream ends (after any messages still queued); panics after 10 s.
    pub async fn ended(&mut self) {
        loop {
            let frame = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                http_body_util::BodyExt::frame(&mut self.body),
            )
            .await
            .expect("the stream ends within 10 s");
            match frame {
                None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            }
        }
    }

    /// The next JSON-RPC message on the stream (keep-alive comments skipped); panics after 10 s.
    pub async fn next(&mut self) -> Value {
        loop {
            if let Some(v) = self.queue.pop_front() {
                return v;
            }
            let frame = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                http_body_util::BodyExt::frame(&mut self.body),
            )
            .await
            .expect("an event within 10 s")
            .expect("the stream is open")
            .unwrap();
            if let Ok(data) = frame.into_data() {
                for e in self.decoder.feed(&data).unwrap() {
                    if !e.data.is_empty() {
                        self.queue.push_back(serde_json::from_str(&e.data).unwrap());
                    }
                }
            }
        }
    }
}
