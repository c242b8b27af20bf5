//! A task's record: everything a store keeps of one task, and the one function that changes it
//! ([`TaskRecord::apply`]). Pure and serializable: no clock (the caller passes the time), no
//! lock, no channel, no compiled schema (what answers a request is worked out from the request
//! itself: see [`crate::input::Asked::from_embedded`]), so that a store shared by several
//! replicas can hold it as it is.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::jsonrpc::ErrorObject;

/// A task's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Ending {
    /// The result, as JSON text (rewritten for modern clients).
    Result(Box<RawValue>),
    /// The JSON-RPC error.
    Error(ErrorObject),
}

/// One task as a store keeps it. Times are milliseconds since the Unix epoch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct TaskRecord {
    /// The task id (a handle: `<instance>.<128 random bits>`).
    pub(crate) id: String,
    /// The digest of the principal that created it (the only one that may see it).
    pub(crate) principal: String,
    /// Its status.
    pub(crate) status: Status,
    /// `statusMessage`: the last progress message, or why it ended.
    pub(crate) message: Option<String>,
    /// `createdAt`.
    pub(crate) created_ms: u64,
    /// `lastUpdatedAt`.
    pub(crate) updated_ms: u64,
    /// When it is dropped (its TTL from its creation).
    pub(crate) expires_ms: u64,
    /// `ttlMs` and `pollIntervalMs` as advertised at its creation.
    pub(crate) ttl_ms: u64,
    /// See `ttl_ms`.
    pub(crate) poll_interval_ms: u64,
    /// The outstanding requests, key → the embedded request as the client sees it: the one list
    /// of what the task asks (what answers each is worked out from it).
    pub(crate) input_requests: Map<String, Value>,
    /// The result or the error, once it ended.
    pub(crate) ending: Option<Ending>,
    /// Times it went from working to `input_required`.
    pub(crate) rounds: u32,
    /// Whether its call may run again on another instance when its holder is gone (the
    /// `[replay]` policy, never for a gated call).
    #[serde(default)]
    pub(crate) replay_safe: bool,
    /// Input keys minted over the task's life: a call run again mints after them, so a key is
    /// never reused.
    #[serde(default)]
    pub(crate) keys_minted: u32,
    /// What runs the call again (a replay-safe task's only): the request and every answer
    /// given so far.
    #[serde(default)]
    pub(crate) call: Option<CallJournal>,
    /// Bumped by every change that took: a writer names the version it read, and a store
    /// refuses a change made against another (see `TaskStore::apply`).
    pub(crate) version: u64,
}

/// What a replay-safe task's call is, for an instance that adopts the task to run it again:
/// the request as it went upstream, and the journal of the answers given (each with the
/// fingerprint of the server request it answered, in order), as a replay-safe MRTR call's token
/// carries them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CallJournal {
    /// `tools/call`.
    pub(crate) method: String,
    /// The tool's name.
    pub(crate) target: String,
    /// The params sent upstream, as JSON text.
    pub(crate) params: Option<Box<RawValue>>,
    /// The client's declared capabilities (what the re-run may ask it for).
    pub(crate) capabilities: Value,
    /// (fingerprint, answer), in the order they were delivered.
    pub(crate) answered: Vec<(String, Value)>,
}

/// One change of a task, as its holder makes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Change {
    /// The upstream asked for more input: `embedded` is listed under `key` (unique over the
    /// task's life) and the task is `input_required`.
    Ask { key: String, embedded: Value },
    /// The upstream withdrew the request under `key`.
    Withdraw { key: String },
    /// The client answered these keys (`tasks/update`); the task is `working` again once none
    /// is outstanding. `journal`: what they answer, for a replay-safe task's journal.
    Answered {
        keys: Vec<String>,
        journal: Vec<(String, Value)>,
    },
    /// The upstream reported progress (`statusMessage`, when it has one).
    Progress { message: Option<String> },
    /// The call finished with a result.
    Complete { result: Box<RawValue> },
    /// The call ended with a JSON-RPC error.
    Fail { error: ErrorObject },
    /// The task was cancelled (by the client, at its TTL, or with its replica): `message`
    /// says which.
    Cancel { message: String },
    /// Its holder was lost and its replay-safe call runs again on the instance that adopted
    /// it: what the lost call asked is no longer outstanding (the new run asks anew what its
    /// journal does not answer); `answered` joins the journal (answers to what it asked that
    /// came with the request that adopted it).
    Rerun { answered: Vec<(String, Value)> },
}

/// What a change did to the status (`from == to` when it did not move it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Transition {
    /// The status before.
    pub(crate) from: Status,
    /// The status after.
    pub(crate) to: Status,
}

impl TaskRecord {
    /// A task just created: `working`, nothing asked.
    #[cfg(test)]
    pub(crate) fn new(id: String, principal: String, now_ms: u64, life: Lifetime) -> Self {
        Self::with_replay(id, principal, now_ms, life, None)
    }

    /// A task just created, whose call may run again elsewhere from `call` (`None`: it may
    /// not).
    pub(crate) fn with_replay(
        id: String,
        principal: String,
        now_ms: u64,
        life: Lifetime,
        call: Option<CallJournal>,
    ) -> Self {
        Self {
            id,
            principal,
            status: Status::Working,
            message: None,
            created_ms: now_ms,
            updated_ms: now_ms,
            expires_ms: now_ms.saturating_add(life.ttl_ms),
            ttl_ms: life.ttl_ms,
            poll_interval_ms: life.poll_interval_ms,
            input_requests: Map::new(),
            ending: None,
            rounds: 0,
            replay_safe: call.is_some(),
            keys_minted: 0,
            call,
            version: 0,
        }
    }

    /// Whether `principal` may see it at `now_ms` (its own, not expired).
    pub(crate) fn visible_to(&self, principal: &str, now_ms: u64) -> bool {
        self.principal == principal && self.expires_ms > now_ms
    }

    /// Applies `change` at `now_ms`. A finished task does not change (`None`); otherwise the
    /// version is bumped and the status transition returned.
    pub(crate) fn apply(&mut self, change: Change, now_ms: u64) -> Option<Transition> {
        let from = self.status;
        if from.is_terminal() {
            return None;
        }
        let to = match change {
            Change::Ask { key, embedded } => {
                self.input_requests.insert(key, embedded);
                self.keys_minted = self.keys_minted.saturating_add(1);
                Status::InputRequired
            }
            Change::Withdraw { key } => {
                self.input_requests.remove(&key);
                self.settled(from)
            }
            Change::Answered { keys, journal } => {
                for k in &keys {
                    self.input_requests.remove(k);
                }
                if let Some(call) = &mut self.call {
                    call.answered.extend(journal);
                }
                self.settled(from)
            }
            Change::Progress { message } => {
                if message.is_some() {
                    self.message = message;
                }
                from
            }
            Change::Complete { result } => self.end(Ending::Result(result), None),
            Change::Fail { error } => {
                let message = Some(error.message.clone());
                self.end(Ending::Error(error), message)
            }
            Change::Rerun { answered } => {
                if let Some(call) = &mut self.call {
                    call.answered.extend(answered);
                }
                self.input_requests.clear();
                Status::Working
            }
            Change::Cancel { message } => {
                self.input_requests.clear();
                self.message = Some(message);
                Status::Cancelled
            }
        };
        if from != Status::InputRequired && to == Status::InputRequired {
            self.rounds = self.rounds.saturating_add(1);
        }
        self.status = to;
        self.updated_ms = now_ms;
        self.version += 1;
        Some(Transition { from, to })
    }

    // `working` once nothing is outstanding; otherwise as it was.
    fn settled(&self, from: Status) -> Status {
        if from == Status::InputRequired && self.input_requests.is_empty() {
            Status::Working
        } else {
            from
        }
    }

    // What a task keeps once it ends; the last progress message says nothing of it.
    fn end(&mut self, ending: Ending, message: Option<String>) -> Status {
        let to = match ending {
            Ending::Result(_) => Status::Completed,
            Ending::Error(_) => Status::Failed,
        };
        self.ending = Some(ending);
        self.input_requests.clear();
        self.message = message;
        to
    }
}

/// A task's lifetime as advertised, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lifetime {
    /// `ttlMs`.
    pub(crate) ttl_ms: u64,
    /// `pollIntervalMs`.
    pub(crate) poll_interval_ms: u64,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const LIFE: Lifetime = Lifetime {
        ttl_ms: 60_000,
        poll_interval_ms: 500,
    };

    fn ask(key: &str) -> Change {
        Change::Ask {
            key: key.into(),
            embedded: json!({"method": "elicitation/create"}),
        }
    }

    #[test]
    fn asking_and_answering_move_the_status_and_count_rounds() {
        let mut r = TaskRecord::new("i.t".into(), "p".into(), 1_000, LIFE);
        assert_eq!(r.expires_ms, 61_000);
        let t = r.apply(ask("elicitation-1"), 1_001).unwrap();
        assert_eq!((t.from, t.to), (Status::Working, Status::InputRequired));
        r.apply(ask("elicitation-2"), 1_002);
        assert_eq!(
            r.rounds, 1,
            "a second ask in the same round is not a new round"
        );
        let keys = vec!["elicitation-1".to_owned()];
        let journal = Vec::new();
        let t = r.apply(Change::Answered { keys, journal }, 1_003).unwrap();
        assert_eq!(t.to, Status::InputRequired, "one is still outstanding");
        let t = r
            .apply(
                Change::Withdraw {
                    key: "elicitation-2".into(),
                },
                1_004,
            )
            .unwrap();
        assert_eq!(t.to, Status::Working);
        assert_eq!((r.version, r.updated_ms), (4, 1_004));
    }

    #[test]
    fn a_finished_task_does_not_change_and_keeps_its_ending() {
        let mut r = TaskRecord::new("i.t".into(), "p".into(), 0, LIFE);
        r.apply(
            Change::Progress {
                message: Some("half".into()),
            },
            1,
        );
        assert_eq!(r.message.as_deref(), Some("half"));
        r.apply(ask("k"), 2);
        let result = RawValue::from_string(r#"{"content":[]}"#.into()).unwrap();
        let t = r.apply(Change::Complete { result }, 3).unwrap();
        assert_eq!(t.to, Status::Completed);
        assert!(r.input_requests.is_empty() && r.message.is_none());
        let version = r.version;
        let cancel = Change::Cancel {
            message: "late".into(),
        };
        assert!(r.apply(cancel, 4).is_none());
        assert_eq!((r.status, r.version), (Status::Completed, version));
    }

    #[test]
    fn a_record_round_trips_through_json() {
        let mut r = TaskRecord::new("i.t".into(), "p".into(), 0, LIFE);
        r.apply(ask("elicitation-1"), 1);
        let error = ErrorObject {
            code: -32603,
            message: "boom".into(),
            data: None,
        };
        r.apply(Change::Fail { error }, 2);
        let text = serde_json::to_string(&r).unwrap();
        let back: TaskRecord = serde_json::from_str(&text).unwrap();
        assert_eq!(back.status, Status::Failed);
        assert_eq!(back.message.as_deref(), Some("boom"));
        assert!(matches!(back.ending, Some(Ending::Error(e)) if e.code == -32603));
        assert!(r.visible_to("p", 59_999) && !r.visible_to("p", 60_000));
        assert!(!r.visible_to("q", 1));
    }
}
