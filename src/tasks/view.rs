//! A task's wire shapes: the `Task` of a `CreateTaskResult`, and the `DetailedTask` of
//! `tasks/get` and `notifications/tasks` (outstanding `inputRequests`, the `result`, or the
//! `error` inlined by status). Pure.

use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use super::record::{Ending, Status, TaskRecord};

/// The `Task` fields (everything but what `DetailedTask` inlines).
pub(crate) fn task(r: &TaskRecord) -> Value {
    let mut task = json!({
        "taskId": r.id,
        "status": r.status.as_str(),
        "createdAt": timestamp(r.created_ms),
        "lastUpdatedAt": timestamp(r.updated_ms),
        "ttlMs": r.ttl_ms,
        "pollIntervalMs": r.poll_interval_ms,
    });
    if let Some(m) = &r.message {
        task["statusMessage"] = Value::String(m.clone());
    }
    task
}

/// The `DetailedTask`: the `Task` with the outstanding requests, the result or the error.
pub(crate) fn detailed(r: &TaskRecord) -> Value {
    let mut task = task(r);
    match (&r.ending, r.status) {
        (_, Status::InputRequired) => {
            task["inputRequests"] = Value::Object(r.input_requests.clone());
        }
        (Some(Ending::Result(result)), _) => {
            task["result"] = serde_json::from_str(result.get()).unwrap_or_else(|_| json!({}));
        }
        (Some(Ending::Error(e)), _) => {
            task["error"] = serde_json::to_value(e).unwrap_or_else(|_| json!({}));
        }
        (None, _) => {}
    }
    task
}

/// RFC 3339 UTC, to the millisecond.
fn timestamp(ms: u64) -> String {
    let t = SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::value::RawValue;

    use super::*;
    use crate::jsonrpc::ErrorObject;
    use crate::tasks::record::{Change, Lifetime};

    const LIFE: Lifetime = Lifetime {
        ttl_ms: 60_000,
        poll_interval_ms: 500,
    };

    #[test]
    fn a_task_has_every_field_of_the_extension() {
        let t0 = 1_700_000_000_123;
        let mut r = TaskRecord::new("i.x".into(), "p".into(), t0, LIFE);
        r.message = Some("half way".into());
        let task = task(&r);
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
        let mut r = TaskRecord::new("t".into(), "p".into(), 0, LIFE);
        r.input_requests.insert(
            "elicitation-1".into(),
            json!({"method": "elicitation/create"}),
        );
        assert!(detailed(&r).get("inputRequests").is_none());
        r.status = Status::InputRequired;
        let d = detailed(&r);
        assert_eq!(
            d["inputRequests"]["elicitation-1"]["method"],
            "elicitation/create"
        );
        let result =
            RawValue::from_string(r#"{"content":[],"resultType":"complete"}"#.into()).unwrap();
        r.apply(Change::Complete { result }, 1);
        let d = detailed(&r);
        assert!(d.get("inputRequests").is_none());
        assert_eq!(d["result"]["content"], json!([]));
        let mut r = TaskRecord::new("t".into(), "p".into(), 0, LIFE);
        let error = ErrorObject {
            code: -32603,
            message: "boom".into(),
            data: None,
        };
        r.apply(Change::Fail { error }, 1);
        assert_eq!(detailed(&r)["error"]["code"], -32603);
    }
}
