//! A minimal modern (2026-07-28) client: enough to drive the proxy in the demo walkthrough and in
//! the in-process tests. It sends the mirrored headers and `_meta`, reads JSON or SSE answers, and
//! returns every message it got. It does not retry on its own; callers drive MRTR rounds.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::BodyExt;
use serde_json::{json, Value};

use crate::body::full;
use crate::http_client::OriginClient;
use crate::sse::SseDecoder;

/// How long one exchange may take to answer, and then to send its whole body.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(60);

/// What one exchange returned.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// HTTP status.
    pub status: StatusCode,
    /// `Content-Type` of the answer.
    pub content_type: String,
    /// Every response header.
    pub headers: http::HeaderMap,
    /// Notifications received before the final message.
    pub notifications: Vec<Value>,
    /// The final JSON-RPC message (response or error), `Null` if none came.
    pub last: Value,
    /// The raw response body (SSE comments included).
    pub raw: Bytes,
}

impl Exchange {
    /// The `result` of the final message (`Null` if it was an error).
    pub fn result(&self) -> &Value {
        &self.last["result"]
    }
}

/// A modern client bound to one proxy URL.
#[derive(Debug, Clone)]
pub struct ModernClient {
    http: OriginClient,
    url: String,
    next_id: std::sync::Arc<std::sync::atomic::AtomicI64>,
    /// Declared capabilities sent on every request.
    pub capabilities: Value,
    /// Extra headers (e.g. `authorization`).
    pub headers: Vec<(String, String)>,
}

impl ModernClient {
    /// A client for `url` declaring `capabilities`.
    pub fn new(url: impl Into<String>, capabilities: Value) -> Self {
        let url = url.into();
        // An unparsable URL fails each request when it is built; the client needs an origin.
        let origin = url
            .parse()
            .unwrap_or_else(|_| Uri::from_static("http://127.0.0.1/"));
        Self {
            http: OriginClient::new(&origin, EXCHANGE_TIMEOUT, 8),
            url,
            next_id: Default::default(),
            capabilities,
            headers: Vec::new(),
        }
    }

    /// A fresh request id.
    pub fn next_id(&self) -> i64 {
        self.next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1
    }

    /// Builds params with the required `_meta` merged in.
    pub fn params(&self, mut params: Value) -> Value {
        if !params.is_object() {
            params = json!({});
        }
        let meta = params
            .as_object_mut()
            .map(|p| p.entry("_meta").or_insert_with(|| json!({})));
        if let Some(Value::Object(m)) = meta {
            m.insert(
                "io.modelcontextprotocol/protocolVersion".into(),
                "2026-07-28".into(),
            );
            m.insert(
                "io.modelcontextprotocol/clientCapabilities".into(),
                self.capabilities.clone(),
            );
            m.insert(
                "io.modelcontextprotocol/clientInfo".into(),
                json!({"name":"mrtr-demo-client","version":"0"}),
            );
        }
        params
    }

    /// Sends `method` with `params` (plus `_meta`) and correct headers.
    ///
    /// # Errors
    /// Transport failures.
    pub async fn request(&self, method: &str, params: Value) -> Result<Exchange, String> {
        let params = self.params(params);
        let body = json!({"jsonrpc":"2.0","id":self.next_id(),"method":method,"params":params});
        let mut headers = vec![("mcp-method".to_owned(), method.to_owned())];
        let target = params
            .get("name")
            .or_else(|| params.get("uri"))
            .or_else(|| params.get("taskId"))
            .and_then(Value::as_str);
        if let (Some(t), true) = (
            target,
            matches!(
                method,
                "tools/call"
                    | "prompts/get"
                    | "resources/read"
                    | "tasks/get"
                    | "tasks/update"
                    | "tasks/cancel"
            ),
        ) {
            headers.push(("mcp-name".to_owned(), t.to_owned()));
        }
        self.send_raw(crate::jsonrpc::text(&body).into(), &headers)
            .await
    }

    /// Sends raw bytes with the protocol version header plus `extra` headers.
    ///
    /// # Errors
    /// Transport failures.
    pub async fn send_raw(
        &self,
        body: Bytes,
        extra: &[(String, String)],
    ) -> Result<Exchange, String> {
        let mut b = Request::post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        // The modern version header, unless the caller sends its own.
        if !extra
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("mcp-protocol-version"))
        {
            b = b.header("mcp-protocol-version", "2026-07-28");
        }
        for (k, v) in extra.iter().chain(self.headers.iter()) {
            b = b.header(k.as_str(), v.as_str());
        }
        let req = b.body(full(body)).map_err(|e| e.to_string())?;
        let resp = self.http.send(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let headers = resp.headers().clone();
        let bytes = tokio::time::timeout(EXCHANGE_TIMEOUT, resp.into_body().collect())
            .await
            .map_err(|_| "body timed out".to_owned())?
            .map_err(|e| e.to_string())?
            .to_bytes();
        let mut messages: Vec<Value> = Vec::new();
        if content_type.starts_with("text/event-stream") {
            let mut dec = SseDecoder::new(16 << 20);
            for ev in dec.feed(&bytes).map_err(|e| e.to_string())? {
                messages.push(serde_json::from_str(&ev.data).map_err(|e| e.to_string())?);
            }
        } else if !bytes.is_empty() {
            messages.push(serde_json::from_slice(&bytes).map_err(|e| e.to_string())?);
        }
        let last = messages.pop().unwrap_or(Value::Null);
        Ok(Exchange {
            status,
            content_type,
            headers,
            notifications: messages,
            last,
            raw: bytes,
        })
    }
}
