//! The 2024-11-05 HTTP+SSE front (`GET /sse`, `POST /messages`) passes the same gates as `/mcp`:
//! a gated tool is asked about on the session's stream before the upstream sees anything, a
//! session that cannot be asked is refused, and one session has one upstream session however
//! many `initialize`s race on it.

use std::collections::VecDeque;
use std::time::Duration;

use futures_util::future::join_all;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use mrtr_proxy::body::{empty, full, Body};
use mrtr_proxy::sse::SseDecoder;
use serde_json::{json, Value};

use crate::support::mock::{Mock, Step};
use crate::support::TestProxy;

const POLICY: &str = r#"
[approval.tools."delete_*"]
message = "Delete {repo}?"
on_decline = "Kept."
"#;

type Http =
    hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Body>;

/// One HTTP+SSE session through the proxy: its stream, and where it POSTs.
pub struct SseSession {
    http: Http,
    messages: String,
    headers: Vec<(String, String)>,
    body: Incoming,
    decoder: SseDecoder,
    pending: VecDeque<Value>,
}

impl SseSession {
    /// Opens `GET /sse` with `headers` and reads the `endpoint` event.
    pub async fn open(proxy: &TestProxy, headers: &[(&str, &str)]) -> Self {
        let http =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<Body>();
        let mut b = Request::get(format!("http://{}/sse", proxy.addr))
            .header("accept", "text/event-stream");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let resp = http.request(b.body(empty()).unwrap()).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "the stream opens");
        let mut body = resp.into_body();
        let mut decoder = SseDecoder::new(1 << 20);
        let endpoint = loop {
            let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
                .await
                .expect("the endpoint event within 10 s")
                .expect("the stream is open")
                .unwrap();
            let Some(data) = frame.data_ref() else {
                continue;
            };
            let events = decoder.feed(data).unwrap();
            if let Some(e) = events
                .iter()
                .find(|e| e.event.as_deref() == Some("endpoint"))
            {
                break e.data.clone();
            }
        };
        Self {
            http,
            messages: format!("http://{}{endpoint}", proxy.addr),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            body,
            decoder,
            pending: VecDeque::new(),
        }
    }

    /// POSTs one message of the session; the status.
    pub async fn post(&self, msg: &Value) -> StatusCode {
        let mut b = Request::post(&self.messages).header("content-type", "application/json");
        for (k, v) in &self.headers {
            b = b.header(k, v);
        }
        let resp = self
            .http
            .request(b.body(full(msg.to_string())).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let _ = resp.into_body().collect().await;
        status
    }

    /// `initialize` (declaring `capabilities`) and `notifications/initialized`; the answer.
    pub async fn initialize(&mut self, capabilities: Value) -> Value {
        let init = json!({"jsonrpc":"2.0","id":"init","method":"initialize","params":{
            "protocolVersion":"2025-11-25","capabilities":capabilities,
            "clientInfo":{"name":"sse-front","version":"1"}}});
        assert_eq!(self.post(&init).await, StatusCode::ACCEPTED);
        let answer = self.next().await;
        assert_eq!(answer["id"], "init", "{answer}");
        let note = json!({"jsonrpc":"2.0","method":"notifications/initialized"});
        assert_eq!(self.post(&note).await, StatusCode::ACCEPTED);
        answer
    }

    /// The next JSON-RPC message on the stream (bounded in time).
    pub async fn next(&mut self) -> Value {
        loop {
            if let Some(m) = self.pending.pop_front() {
                return m;
            }
            let frame = tokio::time::timeout(Duration::from_secs(10), self.body.frame())
                .await
                .expect("a message within 10 s")
                .expect("the stream is still open")
                .unwrap();
            if let Some(data) = frame.data_ref() {
                for ev in self.decoder.feed(data).unwrap() {
                    if ev.event.as_deref().unwrap_or("message") == "message" {
                        self.pending
                            .push_back(serde_json::from_str(&ev.data).unwrap());
                    }
                }
            }
        }
    }
}

/// A scripted upstream whose `delete_repo` and `list_repos` answer at once.
pub async fn repos() -> Mock {
    let mock = Mock::start().await;
    let reply = |text: &str| {
        vec![vec![Step::Reply(
            json!({"content":[{"type":"text","text":text}]}),
        )]]
    };
    mock.script("delete_repo", reply("deleted"));
    mock.script("list_repos", reply("acme/site"));
    mock
}

/// A `tools/call` of `tool` with id `id`.
pub fn call(id: &str, tool: &str) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
           "params":{"name":tool,"arguments":{"repo":"acme/site"}}})
}

/// The answer to the proxy's question `asked`: approve or decline.
pub fn answer(asked: &Value, approve: bool) -> Value {
    json!({"jsonrpc":"2.0","id":asked["id"],
           "result":{"action":"accept","content":{"approve":approve}}})
}

#[tokio::test]
async fn a_gated_call_on_the_sse_front_is_asked_on_the_stream_and_runs_once_approved() {
    let mock = repos().await;
    let proxy = TestProxy::start(&mock.url(), POLICY).await;
    let mut s = SseSession::open(&proxy, &[]).await;
    s.initialize(json!({"elicitation": {}})).await;
    assert_eq!(
        s.post(&call("c1", "delete_repo")).await,
        StatusCode::ACCEPTED
    );
    let asked = s.next().await;
    assert_eq!(asked["method"], "elicitation/create", "{asked}");
    assert_eq!(asked["params"]["message"], "Delete acme/site?");
    assert_eq!(
        mock.calls_of("delete_repo"),
        0,
        "asked before the upstream sees it"
    );
    assert_eq!(s.post(&answer(&asked, true)).await, StatusCode::ACCEPTED);
    let done = s.next().await;
    assert_eq!(done["id"], "c1", "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "deleted", "{done}");
    assert_eq!(mock.calls_of("delete_repo"), 1);
    assert!(
        mock.posted().iter().all(|m| m["id"] != asked["id"]),
        "the answer to the proxy's own question is not relayed"
    );
}

#[tokio::test]
async fn a_declined_call_on_the_sse_front_never_reaches_the_upstream() {
    let mock = repos().await;
    let proxy = TestProxy::start(&mock.url(), POLICY).await;
    let mut s = SseSession::open(&proxy, &[]).await;
    s.initialize(json!({"elicitation": {}})).await;
    s.post(&call("c1", "delete_repo")).await;
    let asked = s.next().await;
    assert_eq!(s.post(&answer(&asked, false)).await, StatusCode::ACCEPTED);
    let done = s.next().await;
    assert_eq!(done["id"], "c1", "{done}");
    assert_eq!(done["result"]["isError"], true, "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "Kept.");
    // The barrier: a later call that did reach the upstream.
    s.post(&call("c2", "list_repos")).await;
    assert_eq!(s.next().await["id"], "c2");
    assert_eq!(mock.calls_of("list_repos"), 1);
    assert_eq!(mock.calls_of("delete_repo"), 0);
}

#[tokio::test]
async fn a_gated_call_of_an_sse_session_that_cannot_elicit_is_refused_on_its_stream() {
    let mock = repos().await;
    let proxy = TestProxy::start(&mock.url(), POLICY).await;
    let mut s = SseSession::open(&proxy, &[]).await;
    s.initialize(json!({})).await;
    assert_eq!(
        s.post(&call("c1", "delete_repo")).await,
        StatusCode::ACCEPTED
    );
    let refused = s.next().await;
    assert_eq!(refused["id"], "c1", "{refused}");
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    s.post(&call("c2", "list_repos")).await;
    assert_eq!(s.next().await["id"], "c2");
    assert_eq!(mock.calls_of("delete_repo"), 0);
}

#[tokio::test]
async fn a_batch_on_the_sse_front_is_refused_whole() {
    let mock = repos().await;
    let proxy = TestProxy::start(&mock.url(), POLICY).await;
    let mut s = SseSession::open(&proxy, &[]).await;
    s.initialize(json!({"elicitation": {}})).await;
    let batch = json!([call("c1", "list_repos"), call("c2", "delete_repo")]);
    assert_eq!(s.post(&batch).await, StatusCode::BAD_REQUEST);
    s.post(&call("c3", "list_repos")).await;
    assert_eq!(s.next().await["id"], "c3");
    assert_eq!(mock.calls_of("delete_repo"), 0);
    assert_eq!(mock.calls_of("list_repos"), 1, "nothing of the batch went");
}

#[tokio::test]
async fn racing_initializes_on_one_sse_session_open_one_upstream_session() {
    let mock = Mock::start().await;
    let proxy = TestProxy::start(&mock.url(), "").await;
    let s = SseSession::open(&proxy, &[]).await;
    let inits = (0..8).map(|i| {
        json!({"jsonrpc":"2.0","id":i,"method":"initialize","params":{
            "protocolVersion":"2025-11-25","capabilities":{},
            "clientInfo":{"name":"racer","version":"1"}}})
    });
    let statuses = join_all(inits.map(|m| {
        let s = &s;
        async move { s.post(&m).await }
    }))
    .await;
    let accepted = statuses
        .iter()
        .filter(|s| **s == StatusCode::ACCEPTED)
        .count();
    assert_eq!(accepted, 1, "{statuses:?}");
    assert!(
        statuses
            .iter()
            .all(|s| *s == StatusCode::ACCEPTED || *s == StatusCode::BAD_REQUEST),
        "{statuses:?}"
    );
    let racers = mock
        .initialized()
        .iter()
        .filter(|i| i["clientInfo"]["name"] == "racer")
        .count();
    assert_eq!(racers, 1, "one upstream session for one HTTP+SSE session");
}

#[tokio::test]
async fn answers_to_the_proxys_questions_need_no_place_in_flight() {
    let mock = repos().await;
    let proxy = TestProxy::start(&mock.url(), POLICY).await;
    let mut s = SseSession::open(&proxy, &[]).await;
    s.initialize(json!({"elicitation": {}})).await;
    // Every place in flight held by a question waiting for its answer.
    let mut asked = Vec::new();
    loop {
        let id = format!("c{}", asked.len());
        match s.post(&call(&id, "delete_repo")).await {
            StatusCode::ACCEPTED => asked.push(s.next().await),
            status => {
                assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
                break;
            }
        }
        assert!(asked.len() <= 64, "the places in flight are bounded");
    }
    assert_eq!(s.post(&answer(&asked[0], true)).await, StatusCode::ACCEPTED);
    let done = s.next().await;
    assert_eq!(done["id"], "c0", "{done}");
    assert_eq!(mock.calls_of("delete_repo"), 1);
}

#[tokio::test]
async fn a_relayed_request_the_upstream_never_answers_gets_its_error_on_the_stream() {
    let mock = Mock::start().await;
    mock.script("crash", vec![vec![Step::Die]]);
    let proxy = TestProxy::start(&mock.url(), "").await;
    let mut s = SseSession::open(&proxy, &[]).await;
    s.initialize(json!({})).await;
    assert_eq!(s.post(&call("c1", "crash")).await, StatusCode::ACCEPTED);
    let failed = s.next().await;
    assert_eq!(failed["id"], "c1", "{failed}");
    assert_eq!(failed["error"]["code"], -32603, "{failed}");
}
