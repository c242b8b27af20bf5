//! Requests the proxy makes on a session for itself, not for a client's call: one request and its
//! reply, and every page of a paginated list on top. A client's call reads its own response
//! instead (`Session::start_request`): it must relay and answer what comes before the reply.

use std::sync::Arc;

use serde_json::{json, Value};

use super::Session;
use crate::jsonrpc::{self, Message};
use crate::upstream::client::UpstreamError;

impl Session {
    /// Sends request `method` with `params` and reads its reply: the result (`null` if the reply
    /// has none). What comes before the reply on its response (notifications, server requests,
    /// malformed messages) is skipped. The wait for the response headers is bounded by the
    /// upstream timeout; the reply is read unbounded: the caller bounds the whole when it must.
    ///
    /// # Errors
    /// As [`Session::start_request`]; [`UpstreamError::Timeout`] without headers in time;
    /// [`UpstreamError::Closed`] when the response ends without the reply;
    /// [`UpstreamError::Protocol`] when the reply is a JSON-RPC error.
    pub(crate) async fn request(
        self: &Arc<Self>,
        method: &str,
        params: &Value,
    ) -> Result<Value, UpstreamError> {
        let params = jsonrpc::raw(params);
        let (id, headers) = self.start_request(
            method,
            params.as_deref().map(serde_json::value::RawValue::get),
        );
        let mut stream = tokio::time::timeout(self.client.timeout(), headers)
            .await
            .map_err(|_| UpstreamError::Timeout)??;
        let id = id.to_string();
        while let Some(bytes) = stream.next().await {
            let Ok(msg) = Message::parse(&bytes?) else {
                continue;
            };
            // The reply: no method, our id (a server request may reuse the number).
            let ours = msg.id.as_ref().is_some_and(|i| i.get().trim() == id);
            if msg.method.is_some() || !ours {
                continue;
            }
            if let Some(err) = msg.error {
                let why = format!("{method} failed: {}", err.message);
                return Err(UpstreamError::Protocol(why));
            }
            let raw = msg.result.as_ref().map_or("null", |r| r.get());
            return serde_json::from_str(raw).map_err(|e| UpstreamError::Protocol(e.to_string()));
        }
        Err(UpstreamError::Closed)
    }

    /// Every item of the paginated `method` (`tools/list`, …): the `field` array of each page,
    /// following `nextCursor` for at most `max_pages` pages. A page that fails ends the listing
    /// with the items read so far.
    pub(crate) async fn list_all(
        self: &Arc<Self>,
        method: &str,
        field: &str,
        max_pages: usize,
    ) -> Vec<Value> {
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..max_pages {
            let params = cursor
                .as_ref()
                .map_or(json!({}), |c| json!({ "cursor": c }));
            let mut page = match self.request(method, &params).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::debug!(error = %e, method, "a listing ended on a failed page");
                    break;
                }
            };
            if let Some(Value::Array(found)) = page.get_mut(field).map(Value::take) {
                items.extend(found);
            }
            cursor = page["nextCursor"].as_str().map(str::to_owned);
            if cursor.is_none() {
                break;
            }
        }
        items
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::time::Duration;

    use http::{Request, Response};
    use http_body_util::{BodyExt, Full};
    use hyper::body::{Bytes, Incoming};
    use hyper_util::rt::TokioIo;
    use tokio::net::TcpListener;
    use tokio::sync::Semaphore;

    use super::*;
    use crate::upstream::changes::ChangeFeed;
    use crate::upstream::client::UpstreamClient;
    use crate::upstream::credentials::{Credentials, LiveCredentials};
    use crate::upstream::session::SessionParams;

    // An upstream on loopback that answers each POST with `answer(request)`: an SSE body of
    // the given messages, or a JSON body when there is one.
    async fn upstream(answer: fn(&Value) -> Vec<Value>) -> Arc<Session> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| async move {
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    let messages = answer(&serde_json::from_slice(&body).unwrap());
                    Ok::<_, Infallible>(reply(&messages))
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc),
                );
            }
        });
        let uri = format!("http://{addr}/mcp").parse().unwrap();
        let client = UpstreamClient::new(uri, Duration::from_secs(5), 1 << 20, 4);
        let params = SessionParams {
            capabilities: json!({}),
            credentials: LiveCredentials::new(Credentials::default()),
            protocol_version: "2025-06-18".into(),
            default_roots: Arc::new(Vec::new()),
            changes: ChangeFeed {
                changes: crate::upstream::changes::Changes::new(1),
                principal: Arc::from("p"),
            },
            extensions: None,
        };
        let permit = Arc::new(Semaphore::new(1)).acquire_owned().await.unwrap();
        Session::build(client, None, None, json!({}), params, permit)
    }

    fn reply(messages: &[Value]) -> Response<Full<Bytes>> {
        let (kind, body) = match messages {
            [one] => ("application/json", one.to_string()),
            _ => {
                let events = messages.iter().map(|m| format!("data: {m}\n\n"));
                ("text/event-stream", events.collect())
            }
        };
        Response::builder()
            .header("content-type", kind)
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    }

    fn result(req: &Value, result: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": req["id"], "result": result})
    }

    #[tokio::test]
    async fn a_request_reads_its_reply_past_what_comes_before_it() {
        let session = upstream(|req| {
            vec![
                json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}),
                json!({"jsonrpc": "2.0", "id": req["id"], "method": "roots/list"}),
                json!("not a message"),
                json!({"jsonrpc": "2.0", "id": 999, "result": {"other": true}}),
                result(req, json!({"echo": req["params"]})),
            ]
        })
        .await;
        let got = session.request("x/y", &json!({"a": 1})).await.unwrap();
        assert_eq!(got, json!({"echo": {"a": 1}}));
    }

    #[tokio::test]
    async fn an_error_reply_or_none_at_all_is_an_error() {
        let session = upstream(|req| match req["method"].as_str() {
            Some("fails") => vec![json!({"jsonrpc": "2.0", "id": req["id"],
                "error": {"code": -32601, "message": "no such method"}})],
            _ => vec![json!({"jsonrpc": "2.0", "method": "notifications/message"})],
        })
        .await;
        let failed = session.request("fails", &json!({})).await.unwrap_err();
        assert!(
            failed.to_string().contains("fails failed: no such method"),
            "{failed}"
        );
        let none = session.request("silent", &json!({})).await.unwrap_err();
        assert!(matches!(none, UpstreamError::Closed), "{none}");
    }

    #[tokio::test]
    async fn a_listing_follows_the_cursor_within_its_bound() {
        // Three pages: `a`, `b`, `c`, then a page that fails.
        let session = upstream(|req| {
            let page = match req["params"]["cursor"].as_str() {
                None => json!({"tools": [{"name": "a"}], "nextCursor": "2"}),
                Some("2") => json!({"tools": [{"name": "b"}], "nextCursor": "3"}),
                Some("3") => json!({"tools": [{"name": "c"}], "nextCursor": "4"}),
                Some(_) => {
                    return vec![json!({"jsonrpc": "2.0", "id": req["id"],
                    "error": {"code": -32602, "message": "bad cursor"}})]
                }
            };
            vec![result(req, page)]
        })
        .await;
        let names = |items: Vec<Value>| -> Vec<String> {
            items
                .iter()
                .map(|t| t["name"].as_str().unwrap().to_owned())
                .collect()
        };
        let all = session.list_all("tools/list", "tools", 10).await;
        assert_eq!(names(all), ["a", "b", "c"], "a failed page ends it");
        let two = session.list_all("tools/list", "tools", 2).await;
        assert_eq!(names(two), ["a", "b"], "at most the bound");
        assert!(session
            .list_all("tools/list", "prompts", 10)
            .await
            .is_empty());
    }
}
