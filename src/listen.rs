//! `subscriptions/listen`: a POST whose SSE response stays open. It leases an upstream session,
//! subscribes upstream to the requested resources, acknowledges, returns the session to the pool
//! pinned (calls borrow it first; it is not reaped), then relays list-changed and resource-updated
//! notifications, tagged with the listen id. If that session dies, the stream ends and the client
//! re-listens.
//!
//! Legacy servers notify changes per session, usually on the session where they happened (a tool
//! that adds a tool notifies its caller's session). So a listen stream takes changes from *every*
//! upstream session of its principal, not only its own; the same change seen on several sessions
//! arrives more than once, which is harmless for these level-triggered notifications.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Response};
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use crate::body::{Body, ChannelBody};
use crate::error::ProxyError;
use crate::front::{ModernRequest, META_SUBSCRIPTION_ID};
use crate::jsonrpc::{self, Message};
use crate::server::App;
use crate::sse;

/// Starts a listen stream.
///
/// # Errors
/// [`ProxyError::InvalidParams`] without a `notifications` filter; pool and upstream errors.
pub async fn serve(
    app: Arc<App>,
    req: ModernRequest,
    principal: String,
    auth: Option<(http::HeaderName, HeaderValue)>,
) -> Result<Response<Body>, ProxyError> {
    let Some(filter) = req
        .params
        .get("notifications")
        .filter(|f| f.is_object())
        .cloned()
    else {
        return Err(ProxyError::InvalidParams(
            "subscriptions/listen needs a notifications object".into(),
        ));
    };
    let lease = app.pool.lease(&principal, &req.capabilities, auth).await?;
    let session = Arc::clone(lease.session());
    let caps = session
        .init_result()
        .get("capabilities")
        .cloned()
        .unwrap_or(Value::Null);
    let wants = |k: &str| filter.get(k).and_then(Value::as_bool).unwrap_or(false);
    // Honoured for every list the upstream has, whether or not it advertises `listChanged`:
    // legacy servers often notify without advertising it (Python FastMCP 1.x does), and relaying
    // what comes costs nothing. A list the upstream does not have can never change.
    let has_list = |k: &str| caps.get(k).is_some_and(Value::is_object);
    let tools = wants("toolsListChanged") && has_list("tools");
    let prompts = wants("promptsListChanged") && has_list("prompts");
    let resources = wants("resourcesListChanged") && has_list("resources");
    let can_subscribe = caps
        .get("resources")
        .and_then(|r| r.get("subscribe"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut uris: Vec<String> = Vec::new();
    if can_subscribe {
        for uri in filter
            .get("resourceSubscriptions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(uri) = uri.as_str() else { continue };
            if let Ok((_, mut stream)) = session
                .request("resources/subscribe", &json!({"uri": uri}))
                .await
            {
                if let Some(Ok(reply)) = stream.next().await {
                    if Message::parse(&reply).is_ok_and(|m| m.error.is_none()) {
                        uris.push(uri.to_owned());
                    }
                }
            }
        }
    }
    let mut granted = serde_json::Map::new();
    for (k, v) in [
        ("toolsListChanged", tools),
        ("promptsListChanged", prompts),
        ("resourcesListChanged", resources),
    ] {
        if v {
            granted.insert(k.into(), true.into());
        }
    }
    if !uris.is_empty() {
        granted.insert("resourceSubscriptions".into(), json!(uris));
    }
    let sub_id: Value = serde_json::from_str(req.id.get()).unwrap_or(Value::Null);
    let ack = jsonrpc::notification_bytes(
        "notifications/subscriptions/acknowledged",
        &json!({"_meta": {META_SUBSCRIPTION_ID: sub_id}, "notifications": granted}),
    );
    let mut events = app.pool.subscribe_changes();
    // The session goes back to the pool, pinned: calls of the same principal and capabilities
    // borrow it first (a legacy server sends per-session updates to the session a tool ran on),
    // and it is neither reaped nor evicted while this stream is open.
    let pin = session.pin_listener();
    drop(lease);
    let (tx, body) = ChannelBody::channel(16);
    let keepalive = app.config.keepalive;
    let mut shutdown = app.shutdown.subscribe();
    let uris: HashSet<String> = uris.into_iter().collect();
    tokio::spawn(async move {
        let _pin = pin;
        if tx.send(sse::encode_message(&ack)).await.is_err() {
            return;
        }
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
        loop {
            tokio::select! {
                ev = events.recv() => match ev {
                    Ok(change) => {
                        if *change.principal != *principal { continue; }
                        let Some(out) = tag(&change.message, &sub_id, tools, prompts, resources, &uris) else { continue };
                        if tx.send(sse::encode_message(&out)).await.is_err() { return; }
                    }
                    Err(RecvError::Lagged(n)) => {
                        tracing::debug!(skipped = n, "a listen stream fell behind the change feed");
                        continue;
                    }
                    Err(RecvError::Closed) => return,
                },
                _ = tick.tick() => {
                    if tx.send(sse::keepalive()).await.is_err() { return; }
                }
                () = tx.closed() => return,
                // The upstream subscriptions died with the session: end the stream so that the
                // client re-listens (there is no replay in 2026-07-28).
                () = session.wait_dead() => return,
                // Shutting down: end the stream now rather than hold the drain to its deadline.
                () = async { let _ = shutdown.wait_for(|down| *down).await; } => return,
            }
        }
    });
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(r)
}

// Keeps only what the filter asked for, tagged with the subscription id.
fn tag(
    bytes: &Bytes,
    sub_id: &Value,
    tools: bool,
    prompts: bool,
    resources: bool,
    uris: &HashSet<String>,
) -> Option<Vec<u8>> {
    let msg = Message::parse(bytes).ok()?;
    let mut params = msg
        .params_value()
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    let keep = match msg.method() {
        "notifications/tools/list_changed" => tools,
        "notifications/prompts/list_changed" => prompts,
        "notifications/resources/list_changed" => resources,
        "notifications/resources/updated" => params
            .get("uri")
            .and_then(Value::as_str)
            .is_some_and(|u| uris.contains(u)),
        _ => false,
    };
    if !keep {
        return None;
    }
    let meta = params
        .as_object_mut()?
        .entry("_meta")
        .or_insert_with(|| json!({}));
    meta.as_object_mut()?
        .insert(META_SUBSCRIPTION_ID.into(), sub_id.clone());
    Some(jsonrpc::notification_bytes(msg.method(), &params))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_and_filters() {
        let uris: HashSet<String> = ["file:///a".to_owned()].into();
        let id = json!(7);
        let lc =
            Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#);
        let out: Value =
            serde_json::from_slice(&tag(&lc, &id, true, false, false, &uris).unwrap()).unwrap();
        assert_eq!(out["params"]["_meta"][META_SUBSCRIPTION_ID], 7);
        assert!(tag(&lc, &id, false, true, true, &uris).is_none());
        let up = Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"file:///b"}}"#);
        assert!(tag(&up, &id, true, true, true, &uris).is_none());
        let progress = Bytes::from_static(
            br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#,
        );
        assert!(
            tag(&progress, &id, true, true, true, &uris).is_none(),
            "request-scoped notifications never go on listen"
        );
    }
}
