//! The session's standalone GET stream: opened right after the handshake (Python servers send
//! `roots/list` there, and drop it when no stream is open), kept open (reconnecting with backoff),
//! and dispatched: a server request goes to the call holding the lease, else gets a default answer;
//! change notifications go to the pool's change feed.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, StatusCode};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::Session;
use crate::body;
use crate::jsonrpc::{ErrorObject, Kind, Message};
use crate::protocol::INVALID_PARAMS;
use crate::upstream::stream::MessageStream;

impl Session {
    // Opens the standalone GET stream and waits until the upstream accepted (or refused) it, so that
    // a server request sent there right after the handshake is not lost.
    pub(super) async fn open_get_stream(self: &Arc<Self>) {
        let (ready_tx, ready_rx) = oneshot::channel();
        let weak = Arc::downgrade(self);
        let task = tokio::spawn(get_stream_loop(weak, ready_tx));
        if let Ok(mut slot) = self.get_task.lock() {
            *slot = Some(task);
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), ready_rx).await;
    }

    /// Handles one message from the GET stream (or, on a link, one no open request took).
    pub(crate) async fn on_get_message(&self, bytes: Bytes) {
        let Ok(msg) = Message::parse(&bytes) else {
            tracing::debug!("ignoring a malformed message on the upstream GET stream");
            return;
        };
        match msg.kind() {
            Ok(Kind::Request) => {
                if msg.method() != "ping" {
                    let inbox = self.inbox.lock().ok().and_then(|s| s.clone());
                    if let Some(inbox) = inbox {
                        if inbox.unbounded_send(bytes).is_ok() {
                            return;
                        }
                    }
                }
                self.answer_default(&msg).await;
            }
            // The upstream withdrew one of its requests: the call it was routed to stops asking
            // for it (its other notifications are the session's).
            Ok(Kind::Notification) if msg.method() == "notifications/cancelled" => {
                let inbox = self.inbox.lock().ok().and_then(|s| s.clone());
                if let Some(inbox) = inbox {
                    let _ = inbox.unbounded_send(bytes);
                }
            }
            Ok(Kind::Notification) => self.publish_change(msg.method(), &bytes),
            _ => {}
        }
    }

    /// Answers a server request that no client call can take.
    pub(crate) async fn answer_default(&self, msg: &Message) {
        let Some(id) = msg.id.as_ref() else { return };
        let answer = default_answer(msg.method(), &self.default_roots);
        let text = answer.as_ref().map(crate::jsonrpc::text);
        let res = match &text {
            Ok(s) => self.answer(id.get(), Ok(s)).await,
            Err(e) => self.answer(id.get(), Err(e)).await,
        };
        if let Err(e) = res {
            tracing::debug!(error = %e, method = msg.method(), "default answer failed");
        }
    }
}

/// What the proxy answers a server request that belongs to no client call (or to a method that
/// may not ask for input): `ping` → `{}`, `roots/list` → the configured roots, elicitation →
/// `decline`, anything else → a JSON-RPC error.
pub(crate) fn default_answer(method: &str, roots: &[Value]) -> Result<Value, ErrorObject> {
    match method {
        "ping" => Ok(json!({})),
        "roots/list" => Ok(json!({"roots": roots})),
        "elicitation/create" => Ok(json!({"action": "decline"})),
        _ => Err(ErrorObject {
            code: INVALID_PARAMS,
            message: format!(
                "{method} is not associated with a client request that can provide input"
            ),
            data: None,
        }),
    }
}

// What one attempt to open the GET stream came to.
#[expect(
    clippy::large_enum_variant,
    reason = "returned once per attempt and taken apart at once: boxing the stream would add an allocation per session"
)]
enum Opened {
    /// The upstream accepted it: its messages.
    Stream(MessageStream),
    /// It failed or was refused for now: try again after a pause.
    Failed,
    /// Nothing more to do: the session is gone or dead, or the upstream offers no GET stream.
    Stop,
}

async fn get_stream_loop(weak: Weak<Session>, ready: oneshot::Sender<()>) {
    let mut ready = Some(ready);
    let mut failures = 0u32;
    loop {
        // Boxed, as the message's handling below: each runs once per stream or per message,
        // and unboxed their state (the request, the client, the response head: 2 KiB) would
        // size the task every session keeps while it waits on the stream.
        let opened = Box::pin(open(&weak)).await;
        if let Some(tx) = ready.take() {
            let _ = tx.send(());
        }
        match opened {
            Opened::Stream(mut stream) => {
                failures = 0;
                while let Some(Ok(msg)) = stream.next().await {
                    let Some(session) = weak.upgrade() else {
                        return;
                    };
                    Box::pin(session.on_get_message(msg)).await;
                }
            }
            Opened::Failed => failures += 1,
            Opened::Stop => break,
        }
        if failures > 5 {
            tracing::warn!("giving up on the upstream GET stream after repeated failures");
            break;
        }
        tokio::time::sleep(Duration::from_millis(200 * u64::from(failures.max(1)))).await;
    }
}

// One attempt to open the GET stream of the session `weak` names.
async fn open(weak: &Weak<Session>) -> Opened {
    let Some(session) = weak.upgrade() else {
        return Opened::Stop;
    };
    if session.is_dead() {
        return Opened::Stop;
    }
    let req = session
        .request_builder(Method::GET)
        .header(header::ACCEPT, "text/event-stream")
        .body(body::empty());
    let Ok(req) = req else { return Opened::Stop };
    let client = session.client.clone();
    drop(session);
    match client.send(req).await {
        Ok(resp) if resp.status().is_success() => {
            Opened::Stream(MessageStream::new(resp, client.max_event_bytes()))
        }
        Ok(resp) if resp.status() == StatusCode::NOT_FOUND => {
            if let Some(s) = weak.upgrade() {
                s.mark_dead();
            }
            Opened::Stop
        }
        // 405: the upstream offers no GET stream; nothing to listen to.
        Ok(resp) if resp.status() == StatusCode::METHOD_NOT_ALLOWED => Opened::Stop,
        Ok(_) | Err(_) => Opened::Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_answers() {
        assert_eq!(
            default_answer("roots/list", &[]).unwrap(),
            json!({"roots": []})
        );
        assert_eq!(
            default_answer("elicitation/create", &[]).unwrap()["action"],
            "decline"
        );
        assert_eq!(
            default_answer("sampling/createMessage", &[])
                .unwrap_err()
                .code,
            -32602
        );
    }
}
