//! What a task is at one moment, and its wire shapes: the `Task` of a `CreateTaskResult`, the
//! `DetailedTask` of `tasks/get` (outstanding `inputRequests`, the `result`, or the `error`
//! inlined by status) and of `notifications/tasks`. Pure.

use std::time::{Duration, SystemTime};

use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::input::Asked;
use crate::jsonrpc::ErrorObject;

/// A task's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// The upstream is working on it.
    Working,
    /// The upstream waits for the client's answers (`tasks/update`).
    InputRequired,
    /// Finished with a result (a tool result with `isError` included).
    Completed,
    /// Ended with a JSON-RPC error.
    Failed,
    /// Cancelled by the client, or by its expiry.
    Cancelled,
}

impl Status {
    /// The wire name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Working => "working",
            Self::InputRequired => "input_required",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Whether the task will not change any more.
    pub(crate) fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }
}

/// How a task ended.
#[derive(Debug)]
pub(super) enum Ending {
    /// The result, as JSON text (rewritten for modern clients).
    Result(Box<RawValue>),
    /// The JSON-RPC error.
    Error(ErrorObject),
}

/// A task's mutable record.
#[derive(Debug)]
pub(super) struct View {
    pub(super) status: Status,
    pub(super) message: Option<String>,
    pub(super) updated: SystemTime,
    /// The outstanding requests, as the client answers them (kind and schema per key).
    pub(super) asked: Vec<Asked>,
    /// The outstanding requests, as the client sees them.
    pub(super) input_requests: Map<String, Value>,
    pub(super) ending: Option<Ending>,
    /// Dropped from the store at its TTL: nothing changes it any more.
    pub(super) dropped: bool,
}

impl View {
    pub(super) fn new(now: SystemTime) -> Self {
        Self {
            status: Status::Working,
            message: None,
            updated: now,
            asked: Vec::new(),
            input_requests: Map::new(),
            ending: None,
            dropped: false,
        }
    }

    /// The `Task` fields (everything but what `DetailedTask` inlines).
    pub(super) fn task(&self, id: &str, created: SystemTime, lifetime: Lifetime) -> Value {
        let mut task = json!({
            "taskId": id,
            "status": self.status.as_str(),
            "createdAt": timestamp(created),
            "lastUpdatedAt": timestamp(self.updated),
            "ttlMs": millis(lifetime.ttl),
            "pollIntervalMs": millis(lifetime.poll_interval),
        });
        if let Some(m) = &self.message {
            task["statusMessage"] = Value::String(m.clone());
        }
        task
    }

    /// The `DetailedTask`: the `Task` with the outstanding requests, the result or the error.
    pub(super) fn detailed(&self, id: &str, created: SystemTime, lifetime: Lifetime) -> Value {
        let mut task = self.task(id, created, lifetime);
        match (&self.ending, self.status) {
            (_, Status::InputRequired) => {
                task["inputRequests"] = Value::Object(self.input_requests.clone());
            }
            (Some(Ending::Result(r)), _) => {
                task["result"] = serde_json::from_str(r.get()).unwrap_or_else(|_| json!({}));
            }
            (Some(Ending::Error(e)), _) => {
                task["error"] = serde_json::to_value(e).unwrap_or_else(|_| json!({}));
            }
            (None, _) => {}
        }
        task
    }
}

/// A task's lifetime as advertised.
#[derive(Debug, Clone, Copy)]
pub(super) struct Lifetime {
    pub(super) ttl: Duration,
    pub(super) poll_interval: Duration,
}

/// RFC 3339 UTC, to the millisecond.
fn timestamp(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIFE: Lifetime = Lifetime {
        ttl: Duration::from_secs(60),
        poll_interval: Duration::from_millis(500),
    };

    #[test]
    fn a_task_has_every_field_of_the_extension() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let mut v = View::new(t0);
        v.message = Some("half way".into());
        let task = v.task("i.x", t0, LIFE);
        assert_eq!(task["taskId"], "i.x");
        assert_eq!(task["status"], "working");
        assert_eq!(task["createdAt"], "2023-11-14T22:13:20.123Z");
        assert_eq!(task["lastUpdatedAt"], task["createdAt"]);
        assert_eq!(task["ttlMs"], 60_000);
        assert_eq!(task["pollIntervalMs"], 500);
        assert_eq!(task["statusMessage"], "half way");
    }

    #[test]
    fn a_detailed_task_inlines_by_status() {
        let t0 = SystemTime::now();
        let mut v = View::new(t0);
        v.input_requests.insert(
            "elicitation-1".into(),
            json!({"method": "elicitation/create"}),
        );
        assert!(v.detailed("t", t0, LIFE).get("inputRequests").is_none());
        v.status = Status::InputRequired;
        let d = v.detailed("t", t0, LIFE);
        assert_eq!(
            d["inputRequests"]["elicitation-1"]["method"],
            "elicitation/create"
        );
        v.status = Status::Completed;
        v.ending = Some(Ending::Result(
            RawValue::from_string(r#"{"content":[],"resultType":"complete"}"#.into()).unwrap(),
        ));
        let d = v.detailed("t", t0, LIFE);
        assert!(d.get("inputRequests").is_none());
        assert_eq!(d["result"]["content"], json!([]));
        v.status = Status::Failed;
        v.ending = Some(Ending::Error(ErrorObject {
            code: -32603,
            message: "boom".into(),
            data: None,
        }));
        assert_eq!(v.detailed("t", t0, LIFE)["error"]["code"], -32603);
    }
}
