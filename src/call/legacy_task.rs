//! A tool the upstream runs only as a 2025-11-25 task (`execution.taskSupport: "required"` in its
//! `tools/list`; called plainly, it answers with an error, -32601 by the spec): the call is sent
//! again task-augmented (`task: {ttl}`), and the actor then waits on `tasks/result`, whose stream
//! carries the legacy task's server requests and, at last, the tool's result. So the rounds of a
//! client without the extension, a modern task, and the call's end all work as for any call.
//! Abandoning the call cancels the legacy task (`tasks/cancel`).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::replaying::tool_hint;
use super::{Call, LegacyTask};
use crate::error::ProxyError;
use crate::jsonrpc::{self, Message};
use crate::protocol::{INTERNAL_ERROR, METHOD_NOT_FOUND};
use crate::upstream::{Session, UpstreamError};

/// The legacy `_meta` key naming the task a message belongs to.
const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";
/// How long a `tasks/cancel` or `tasks/get` of the upstream may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

impl Call {
    /// The upstream refused a `tools/call` with `msg` (-32601, as the spec has a server refuse a
    /// task-required tool called plainly): when its `tools/list` says the tool requires a task,
    /// run it as one and return `true` (the call goes on, or failed trying).
    pub(super) async fn run_as_legacy_task(&mut self, msg: &Message) -> bool {
        let refused = msg.error.as_ref().map(|e| e.code) == Some(METHOD_NOT_FOUND);
        if self.legacy_task.is_some() || self.spec.method != "tools/call" || !refused {
            return false;
        }
        let Some(session) = self.session() else {
            return false;
        };
        // Boxed, as every await below: a path taken once per refused call, whose futures would
        // otherwise be carried (and moved) in every final answer's.
        let hint = Box::pin(tool_hint(
            &self.ctx.tool_hints,
            Some(Arc::clone(&session)),
            &self.spec.target,
        ));
        if !hint.await.is_some_and(|h| h.task_required) {
            return false;
        }
        tracing::debug!("the upstream runs this tool only as a task: calling it as one");
        if let Err(e) = Box::pin(self.start_legacy_task(&session)).await {
            Box::pin(self.fail(e)).await;
        }
        true
    }

    async fn start_legacy_task(&mut self, session: &Arc<Session>) -> Result<(), ProxyError> {
        let mut params: Value = self
            .spec
            .upstream_params
            .as_ref()
            .and_then(|p| serde_json::from_str(p).ok())
            .unwrap_or_else(|| json!({}));
        let ttl = u64::try_from(self.ctx.tasks.ttl().as_millis()).unwrap_or(u64::MAX);
        params["task"] = json!({ "ttl": ttl });
        let created = session.request("tools/call", &params).await?;
        let Some(id) = created["task"]["taskId"].as_str() else {
            let why = "a task-augmented tools/call was not answered with a task".to_owned();
            return Err(UpstreamError::Protocol(why).into());
        };
        let result_params = jsonrpc::raw(&json!({ "taskId": id }))
            .ok_or_else(|| ProxyError::Internal("task params".into()))?;
        self.legacy_task = Some(LegacyTask {
            id: id.to_owned(),
            result_params,
        });
        self.send_request().await
    }

    /// The final message of a legacy task's `tasks/result`: as it is, unless it carries no tool
    /// result (the SDKs answer so for a task that failed or was cancelled upstream); then an
    /// error saying what the task's own status says.
    pub(super) async fn legacy_task_ending(&mut self, mut msg: Message) -> Message {
        let Some(task) = &self.legacy_task else {
            return msg;
        };
        let has_content = msg
            .result
            .as_ref()
            .and_then(|r| serde_json::from_str::<Value>(r.get()).ok())
            .is_some_and(|r| r.get("content").is_some());
        if msg.error.is_some() || has_content {
            return msg;
        }
        let params = json!({ "taskId": task.id });
        let status = match self.session() {
            // Boxed: only a legacy task's end waits here.
            Some(session) => Box::pin(tokio::time::timeout(
                LOOKUP_TIMEOUT,
                session.request("tasks/get", &params),
            ))
            .await
            .ok()
            .and_then(Result::ok),
            None => None,
        };
        let message = status.as_ref().map_or_else(
            || "the upstream's task ended without a result".to_owned(),
            |t| match t["statusMessage"].as_str() {
                Some(m) => m.to_owned(),
                None => format!("the upstream's task ended {}", t["status"]),
            },
        );
        msg.result = None;
        msg.error = Some(jsonrpc::ErrorObject {
            code: INTERNAL_ERROR,
            message,
            data: None,
        });
        msg
    }

    /// Cancels the legacy task upstream, if the call runs one (its `tasks/result` request was
    /// already cancelled with the call).
    pub(super) async fn cancel_legacy_task(&mut self, session: &Arc<Session>) {
        let Some(task) = self.legacy_task.take() else {
            return;
        };
        let params = json!({ "taskId": task.id });
        let asked = session.request("tasks/cancel", &params);
        match tokio::time::timeout(LOOKUP_TIMEOUT, asked).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "the upstream refused tasks/cancel"),
            Err(_) => tracing::debug!("the upstream did not answer tasks/cancel in time"),
        }
    }
}

/// A legacy task's result without its related-task `_meta` (the extension has none; the task
/// is the proxy's business, not the client's).
pub(super) fn without_related_task(raw: &str) -> String {
    let Ok(Value::Object(mut result)) = serde_json::from_str::<Value>(raw) else {
        return raw.to_owned();
    };
    if let Some(Value::Object(meta)) = result.get_mut("_meta") {
        meta.remove(RELATED_TASK);
        if meta.is_empty() {
            result.remove("_meta");
        }
    }
    jsonrpc::text(&Value::Object(result))
}
