//! What the upstream notifies during a call: progress and log messages relayed to the open
//! exchange (under its own progress token, filtered by its log level), URL-elicitation
//! completions and the upstream's own cancellations consumed here.

use serde_json::Value;

use super::{Call, Leg};
use crate::jsonrpc::{self, Message};
use crate::tasks::Change;

impl Call {
    pub(super) async fn on_notification(&mut self, msg: &Message) {
        match msg.method() {
            "notifications/progress" => {
                if let Some(leg) = self.phase.leg() {
                    if !relay_progress(leg, msg) {
                        self.ctx.metrics.notification_dropped();
                    }
                } else {
                    let message = progress_message(msg);
                    self.write_task(Change::Progress { message }).await;
                }
            }
            "notifications/message" => {
                if let Some(leg) = self.phase.leg() {
                    if !relay_log(leg, msg) {
                        self.ctx.metrics.notification_dropped();
                    }
                }
            }
            // The upstream's own task (a tool it runs only as one) says how it is going.
            "notifications/tasks/status" => {
                let params = msg.params_value().unwrap_or_default();
                let message = params.get("statusMessage").and_then(Value::as_str);
                if let Some(m) = message {
                    let message = Some(m.to_owned());
                    self.write_task(Change::Progress { message }).await;
                }
            }
            // URL-mode completion is a legacy-only notification: consumed here, never relayed.
            "notifications/elicitation/complete" => {
                let params = msg.params_value().unwrap_or_default();
                let id = params.get("elicitationId").and_then(Value::as_str);
                let known = id.is_some_and(|id| self.rounds.is_pending_url(id));
                tracing::debug!(known, "upstream reported a URL elicitation complete");
            }
            // The upstream gave up on one of its own requests (TS SDK: after 60 s).
            "notifications/cancelled" => {
                let params = msg.params_value().unwrap_or_default();
                let key = params
                    .get("requestId")
                    .and_then(|rid| self.rounds.forget(&rid.to_string()));
                if let Some(key) = key {
                    tracing::debug!(key, "the upstream withdrew one of its requests");
                    self.write_task(Change::Withdraw { key }).await;
                }
            }
            _ => {}
        }
    }
}

// Progress goes to the open exchange under *its* token: a retry may carry another token
// than the one the upstream knows. `false` when it was dropped (the client is not reading).
fn relay_progress(leg: &Leg, msg: &Message) -> bool {
    let Some(token) = &leg.progress_token else {
        return true;
    };
    let Ok(Value::Object(mut params)) = msg.params_value() else {
        return true;
    };
    params.insert("progressToken".into(), token.clone());
    leg.notify(jsonrpc::notification_bytes(
        msg.method(),
        &Value::Object(params),
    ))
}

// What a task's `statusMessage` says of an upstream progress notification: its message, or
// how far it is.
fn progress_message(msg: &Message) -> Option<String> {
    let params = msg.params_value().ok()?;
    if let Some(m) = params.get("message").and_then(Value::as_str) {
        return Some(m.to_owned());
    }
    let progress = params.get("progress")?;
    Some(match params.get("total") {
        Some(total) => format!("{progress} of {total}"),
        None => format!("{progress}"),
    })
}

// Log messages go to the open exchange only when it asked for a level, at or above it.
// `false` when it was dropped (the client is not reading).
fn relay_log(leg: &Leg, msg: &Message) -> bool {
    let Some(threshold) = leg.log_level.as_deref() else {
        return true;
    };
    let Ok(params) = msg.params_value() else {
        return true;
    };
    let level = params
        .get("level")
        .and_then(Value::as_str)
        .unwrap_or("info");
    severity(level) < severity(threshold)
        || leg.notify(jsonrpc::notification_bytes(msg.method(), &params))
}

/// Syslog severity order used by MCP logging levels.
fn severity(level: &str) -> u8 {
    match level {
        "debug" => 0,
        "info" => 1,
        "notice" => 2,
        "warning" => 3,
        "error" => 4,
        "critical" => 5,
        "alert" => 6,
        "emergency" => 7,
        _ => 1,
    }
}
