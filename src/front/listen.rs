//! `subscriptions/listen`: a POST whose SSE response stays open. It takes an upstream session
//! pinned for listen streams (`SessionPool::listen`: streams of one principal and capabilities
//! share one, and a principal's streams pin at most `pool.max_listen_sessions_per_principal`;
//! past it a stream of other capabilities gets 503), subscribes upstream to the requested
//! resources, acknowledges, leaves the session in the pool pinned (calls borrow it first; it is
//! not reaped), then relays list-changed and resource-updated notifications, tagged with the
//! listen id. If that session dies, the stream ends and the client re-listens.
//!
//! With the tasks extension, `notifications.taskIds` follows tasks this instance owns: each change
//! of one is pushed whole (`notifications/tasks`, the task as `tasks/get` gives it).
//!
//! Legacy servers notify changes per session, usually on the session where they happened (a tool
//! that adds a tool notifies its caller's session). So a listen stream takes changes from *every*
//! upstream session of its principal, not only its own. A change every session notifies arrives
//! once: the feed gathers its copies and publishes it when they stop (`upstream::changes`).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use serde_json::{json, Map, Value};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::sync::watch;
use tracing::Instrument;

use super::start::declares_tasks;
use super::validate::ModernRequest;
use crate::app::App;
use crate::body::Body;
use crate::edge::SseWriter;
use crate::error::ProxyError;
use crate::jsonrpc::{self, Message};
use crate::ops::metrics::Limit;
use crate::protocol::META_SUBSCRIPTION_ID;
use crate::tasks::Tasks;
use crate::upstream::{Change, Credentials, ListenRefused, Pin, Session};

/// What a listen stream carries: the lists whose changes it relays and the resources it follows.
#[derive(Debug, Default)]
struct Filter {
    tools: bool,
    prompts: bool,
    resources: bool,
    uris: HashSet<String>,
    /// Tasks followed (owned here, by this principal).
    task_ids: HashSet<String>,
}

/// One open listen stream's sources.
struct Feed {
    principal: String,
    sub_id: Value,
    filter: Filter,
    events: broadcast::Receiver<Change>,
    /// Tasks that changed (read only when the filter follows some).
    task_changes: broadcast::Receiver<Arc<str>>,
    tasks: Arc<Tasks>,
    session: Arc<Session>,
    shutdown: watch::Receiver<bool>,
    _pin: Pin,
}

/// Starts a listen stream.
///
/// # Errors
/// [`ProxyError::InvalidParams`] without a `notifications` filter; pool and upstream errors.
pub(super) async fn serve(
    app: &Arc<App>,
    req: ModernRequest,
    principal: String,
    credentials: Credentials,
) -> Result<Response<Body>, ProxyError> {
    let notifications = req.params.get::<Value>("notifications");
    let Some(asked) = notifications.as_ref().filter(|f| f.is_object()) else {
        return Err(ProxyError::InvalidParams(
            "subscriptions/listen needs a notifications object".into(),
        ));
    };
    let listening = app
        .pool
        .listen(&principal, &req.declared, &credentials, |s| {
            subscribes(asked, s)
        })
        .await
        .map_err(|refused| refusal(app, refused))?;
    let session = Arc::clone(listening.session());
    let may_subscribe = listening.is_exclusive();
    let timeout = app.config.upstream.timeout;
    let mut filter = Filter::negotiate(asked, &session, may_subscribe, timeout).await;
    if declares_tasks(&req.capabilities) {
        filter.task_ids = follow_tasks(asked, &app.calls.tasks, &principal).await;
    }
    let sub_id: Value = serde_json::from_str(req.id.get()).unwrap_or(Value::Null);
    let ack = jsonrpc::notification_bytes(
        "notifications/subscriptions/acknowledged",
        &json!({"_meta": {META_SUBSCRIPTION_ID: sub_id}, "notifications": filter.granted()}),
    );
    // The session goes back to the pool, pinned: calls of the same principal and capabilities
    // borrow it first (a legacy server sends per-session updates to the session a tool ran on),
    // and it is neither reaped nor evicted while a stream on it is open.
    let feed = Feed {
        principal,
        sub_id,
        filter,
        events: app.pool.subscribe_changes(),
        task_changes: app.calls.tasks.changes(),
        tasks: Arc::clone(&app.calls.tasks),
        _pin: listening.into_pin(),
        session,
        shutdown: app.draining.subscribe(),
    };
    let (writer, resp) = SseWriter::open(app.config.server.keepalive);
    tokio::spawn(relay(writer, ack, feed).instrument(tracing::Span::current()));
    Ok(resp)
}

// The error a listen stream the pool refused gets: past the principal's bound, which bound.
fn refusal(app: &App, refused: ListenRefused) -> ProxyError {
    match refused {
        ListenRefused::Bound(n) => {
            app.metrics.limit_hit(Limit::PrincipalSessions);
            ProxyError::Overloaded(format!(
                "this principal's listen streams pin as many upstream sessions as they may \
                 (pool.max_listen_sessions_per_principal = {n}), none with these \
                 capabilities; end a stream or retry later"
            ))
        }
        ListenRefused::Upstream(e) => ProxyError::Upstream(e),
    }
}

// Whether a stream that asked `asked` subscribes to resources on `session` (so needs it to
// itself while it does): it asks for some and the upstream accepts `resources/subscribe`.
fn subscribes(asked: &Value, session: &Session) -> bool {
    let asks = asked
        .get("resourceSubscriptions")
        .and_then(Value::as_array)
        .is_some_and(|uris| uris.iter().any(Value::is_string));
    asks && can_subscribe(session)
}

fn can_subscribe(session: &Session) -> bool {
    session.init_result()["capabilities"]["resources"]["subscribe"]
        .as_bool()
        .unwrap_or(false)
}

async fn relay(mut writer: SseWriter, ack: Vec<u8>, mut feed: Feed) {
    if writer.send(&ack).await.is_err() {
        return;
    }
    while let Ok(Some(message)) = writer.pump(feed.next()).await {
        if writer.send(&message).await.is_err() {
            return;
        }
    }
}

impl Feed {
    /// The next notification for this stream; `None` when the stream must end.
    async fn next(&mut self) -> Option<Vec<u8>> {
        loop {
            let mut changed = None;
            tokio::select! {
                ev = self.events.recv() => match ev {
                    Ok(change) => {
                        if *change.principal != *self.principal {
                            continue;
                        }
                        if let Some(out) = self.filter.tag(&change.message, &self.sub_id) {
                            return Some(out);
                        }
                    }
                    Err(RecvError::Lagged(n)) => {
                        tracing::debug!(skipped = n, "a listen stream fell behind the change feed");
                    }
                    Err(RecvError::Closed) => return None,
                },
                id = self.task_changes.recv(), if !self.filter.task_ids.is_empty() => match id {
                    // Read once the select is over (its futures borrow the stream).
                    Ok(id) => {
                        changed = Some(id);
                    }
                    Err(RecvError::Lagged(n)) => {
                        tracing::debug!(skipped = n, "a listen stream fell behind the task changes");
                    }
                    Err(RecvError::Closed) => return None,
                },
                // The upstream subscriptions died with the session: end the stream so that the
                // client re-listens (there is no replay in 2026-07-28).
                () = self.session.wait_dead() => return None,
                // Shutting down: end the stream now rather than hold the drain to its deadline.
                _ = self.shutdown.wait_for(|down| *down) => return None,
            }
            if let Some(id) = changed {
                let who = (self.principal.as_str(), &self.sub_id);
                if let Some(out) = task_notification(&self.filter, &self.tasks, who, &id).await {
                    return Some(out);
                }
            }
        }
    }
}

/// `notifications/tasks` for task `id` when `filter` follows it: the task as it is now (several
/// quick changes may be pushed as one).
async fn task_notification(
    filter: &Filter,
    tasks: &Tasks,
    (principal, sub_id): (&str, &Value),
    id: &str,
) -> Option<Vec<u8>> {
    if !filter.task_ids.contains(id) {
        return None;
    }
    let mut task = tasks.get(id, principal).await.ok()?;
    task["_meta"] = json!({ META_SUBSCRIPTION_ID: sub_id });
    Some(jsonrpc::notification_bytes("notifications/tasks", &task))
}

// The tasks of `notifications.taskIds` this stream may follow: owned here and by `principal`
// (others are left out of the acknowledgement; a client polls them).
async fn follow_tasks(asked: &Value, tasks: &Tasks, principal: &str) -> HashSet<String> {
    let ids = asked.get("taskIds").and_then(Value::as_array);
    let mut followed = HashSet::new();
    for id in ids.into_iter().flatten().filter_map(Value::as_str) {
        if tasks.visible(id, principal).await {
            followed.insert(id.to_owned());
        }
    }
    followed
}

impl Filter {
    /// What the client asked for that the upstream can give. `…ListChanged` is honoured for
    /// every list the upstream has, whether or not it advertises `listChanged`: legacy servers
    /// often notify without advertising it (Python FastMCP 1.x does), and relaying what comes
    /// costs nothing; a list the upstream does not have can never change. Resources are
    /// followed when the upstream accepts `resources/subscribe` on this session, and the stream
    /// has it to itself (`exclusive`; it has whenever it subscribes, see [`subscribes`]).
    async fn negotiate(
        asked: &Value,
        session: &Arc<Session>,
        exclusive: bool,
        timeout: Duration,
    ) -> Self {
        let init = session.init_result();
        let caps = &init["capabilities"];
        let wants = |k: &str| asked.get(k).and_then(Value::as_bool).unwrap_or(false);
        let has_list = |k: &str| caps.get(k).is_some_and(Value::is_object);
        let mut uris = HashSet::new();
        if exclusive && can_subscribe(session) {
            let asked_uris = asked.get("resourceSubscriptions").and_then(Value::as_array);
            for uri in asked_uris.into_iter().flatten().filter_map(Value::as_str) {
                if subscribe(session, uri, timeout).await {
                    uris.insert(uri.to_owned());
                }
            }
        }
        Self {
            tools: wants("toolsListChanged") && has_list("tools"),
            prompts: wants("promptsListChanged") && has_list("prompts"),
            resources: wants("resourcesListChanged") && has_list("resources"),
            uris,
            task_ids: HashSet::new(),
        }
    }

    /// The acknowledged filter.
    fn granted(&self) -> Map<String, Value> {
        let mut granted = Map::new();
        for (k, on) in [
            ("toolsListChanged", self.tools),
            ("promptsListChanged", self.prompts),
            ("resourcesListChanged", self.resources),
        ] {
            if on {
                granted.insert(k.into(), true.into());
            }
        }
        if !self.uris.is_empty() {
            let mut uris: Vec<&String> = self.uris.iter().collect();
            uris.sort();
            granted.insert("resourceSubscriptions".into(), json!(uris));
        }
        if !self.task_ids.is_empty() {
            let mut ids: Vec<&String> = self.task_ids.iter().collect();
            ids.sort();
            granted.insert("taskIds".into(), json!(ids));
        }
        granted
    }

    /// Keeps only what the filter asked for, tagged with the subscription id.
    fn tag(&self, bytes: &Bytes, sub_id: &Value) -> Option<Vec<u8>> {
        let msg = Message::parse(bytes).ok()?;
        let mut params = msg
            .params_value()
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        let keep = match msg.method() {
            "notifications/tools/list_changed" => self.tools,
            "notifications/prompts/list_changed" => self.prompts,
            "notifications/resources/list_changed" => self.resources,
            "notifications/resources/updated" => params
                .get("uri")
                .and_then(Value::as_str)
                .is_some_and(|u| self.uris.contains(u)),
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
}

// Subscribes the session to `uri` upstream; true when the upstream accepted within `timeout`
// (an upstream that asks something on that stream instead would never answer).
async fn subscribe(session: &Arc<Session>, uri: &str, timeout: Duration) -> bool {
    let params = json!({"uri": uri});
    let asked = session.request("resources/subscribe", &params);
    matches!(tokio::time::timeout(timeout, asked).await, Ok(Ok(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_and_filters() {
        let uris: HashSet<String> = ["file:///a".to_owned()].into();
        let all = Filter {
            tools: true,
            prompts: true,
            resources: true,
            uris: uris.clone(),
            task_ids: ["i.t".to_owned()].into(),
        };
        let no_tools = Filter {
            tools: false,
            uris,
            ..Filter::default()
        };
        let id = json!(7);
        let lc =
            Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#);
        let out: Value = serde_json::from_slice(&all.tag(&lc, &id).unwrap()).unwrap();
        assert_eq!(out["params"]["_meta"][META_SUBSCRIPTION_ID], 7);
        assert!(no_tools.tag(&lc, &id).is_none());
        let up = Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"file:///b"}}"#);
        assert!(all.tag(&up, &id).is_none());
        let mine = Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"file:///a"}}"#);
        assert!(no_tools.tag(&mine, &id).is_some());
        let progress = Bytes::from_static(
            br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#,
        );
        assert!(
            all.tag(&progress, &id).is_none(),
            "request-scoped notifications never go on listen"
        );
        assert_eq!(
            all.granted(),
            json!({"toolsListChanged": true, "promptsListChanged": true, "resourcesListChanged": true, "resourceSubscriptions": ["file:///a"], "taskIds": ["i.t"]})
                .as_object()
                .cloned()
                .unwrap()
        );
    }
}
