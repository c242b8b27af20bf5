//! The tasks of this instance: id → record, bound to the principal that created it, bounded in
//! count (in all and per principal) and memory, each living `tasks.ttl` from its creation. The
//! call actor running a task holds its [`TaskGuard`] and writes through it; the front reads
//! (`get`) and hands the client's answers and cancellations to the actor ([`Control`]). Every
//! status change is logged once and counted here. No map reference is held across an `.await`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use dashmap::DashMap;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

use super::view::{Ending, Lifetime, Status, View};
use crate::config;
use crate::error::ProxyError;
use crate::input::Asked;
use crate::jsonrpc::ErrorObject;
use crate::limits::Quota;
use crate::ops::metrics::{Metrics, TaskState};
use crate::state::random_id;
use crate::upstream::Credentials;

/// What one task is charged besides its params and its result, until its TTL: its record and
/// the inputs it asks.
pub(crate) const TASK_OVERHEAD: usize = 16 * 1024;
/// What a task is charged besides, while its call runs: the call's actor, its session and that
/// session's two upstream connections, what a parked call holds
/// ([`crate::config::PARKED_CALL_BYTES`]). `cargo bench --bench tasks` measured 76 KiB of RSS
/// per task waiting for input (500 tasks), against the 80 KiB these two charge; a finished task
/// holds its record and result only.
pub(crate) const RUNNING_TASK_BYTES: usize = crate::config::PARKED_CALL_BYTES;
/// Bytes of randomness in a task id (128 bits: the id is a handle, though bound to a principal).
const ID_BYTES: usize = 16;
/// Client messages a task's actor may have queued.
const CONTROL_BUFFER: usize = 64;
/// Task changes a `subscriptions/listen` stream may fall behind by before it skips some.
const CHANGES_BUFFER: usize = 256;

/// What the client tells a running task, through the front.
#[derive(Debug)]
pub(crate) enum Control {
    /// `tasks/update`: answers to outstanding requests, each checked against what it answers,
    /// and what goes upstream with them (the update's own credentials).
    /// The span is the client span of their delivery upstream (ends once delivered).
    Answers(Map<String, Value>, Credentials, tracing::Span),
    /// `tasks/cancel`.
    Cancel,
}

/// How a task's owner is named in its id: `<instance id>.<128 random bits>`.
const ID_SEPARATOR: char = '.';

/// The instance that owns task `id` (the part before the last separator), when it has one.
pub(crate) fn owner_of(id: &str) -> Option<&str> {
    id.rsplit_once(ID_SEPARATOR)
        .map(|(owner, _)| owner)
        .filter(|o| !o.is_empty())
}

/// The tasks of this instance.
#[derive(Debug)]
pub(crate) struct Tasks {
    map: DashMap<String, Arc<Entry>>,
    quota: Quota,
    config: config::Tasks,
    owner: String,
    metrics: Arc<Metrics>,
    changes: broadcast::Sender<Arc<str>>,
}

#[derive(Debug)]
struct Entry {
    principal: String,
    created: SystemTime,
    born: Instant,
    expires: Instant,
    bytes: AtomicUsize,
    control: mpsc::Sender<Control>,
    view: Mutex<View>,
    /// Times the task went from working to input_required.
    rounds: AtomicUsize,
}

/// Held by the call actor running the task: what it writes. Dropped before the task reached a
/// final status (the actor ended some other way), the task is marked failed.
#[derive(Debug)]
pub(crate) struct TaskGuard {
    tasks: Arc<Tasks>,
    id: String,
    entry: Arc<Entry>,
}

/// An unknown task, an expired one and another principal's look the same (-32602).
pub(crate) fn unknown() -> ProxyError {
    ProxyError::InvalidParams("unknown or expired taskId".into())
}

impl Tasks {
    /// No tasks yet; ids name `owner` (this instance).
    pub(crate) fn new(config: config::Tasks, owner: String, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            map: DashMap::new(),
            quota: Quota::new(config.bounds(), "tasks"),
            config,
            owner,
            metrics,
            changes: broadcast::channel(CHANGES_BUFFER).0,
        })
    }

    /// How long a task lives (also asked of an upstream's legacy task).
    pub(crate) fn ttl(&self) -> std::time::Duration {
        self.config.ttl
    }

    /// Whether task `id` would live here (its owner is this instance).
    pub(crate) fn is_mine(&self, id: &str) -> bool {
        owner_of(id) == Some(self.owner.as_str())
    }

    /// Bytes charged to tasks now.
    pub(crate) fn held_bytes(&self) -> usize {
        self.quota.held_bytes()
    }

    /// Ids of tasks that changed, for `subscriptions/listen` (which reads each with `get`).
    pub(crate) fn changes(&self) -> broadcast::Receiver<Arc<str>> {
        self.changes.subscribe()
    }

    /// Creates a task for `principal` charged `held` bytes (its params) plus the overhead; the
    /// actor gets its guard and the client's messages.
    ///
    /// # Errors
    /// [`ProxyError::Overloaded`] past `tasks.max`, `tasks.max_per_principal` or
    /// `tasks.max_memory`.
    pub(crate) fn create(
        self: &Arc<Self>,
        principal: &str,
        held: usize,
    ) -> Result<(TaskGuard, mpsc::Receiver<Control>), ProxyError> {
        let bytes = held
            .saturating_add(TASK_OVERHEAD)
            .saturating_add(RUNNING_TASK_BYTES);
        self.quota.admit(principal, bytes)?;
        let (control, rx) = mpsc::channel(CONTROL_BUFFER);
        let now = Instant::now();
        let created = SystemTime::now();
        let entry = Arc::new(Entry {
            principal: principal.to_owned(),
            created,
            born: now,
            expires: now + self.config.ttl,
            bytes: AtomicUsize::new(bytes),
            control,
            view: Mutex::new(View::new(created)),
            rounds: AtomicUsize::new(0),
        });
        let id = format!("{}{ID_SEPARATOR}{}", self.owner, random_id(ID_BYTES));
        self.map.insert(id.clone(), Arc::clone(&entry));
        self.metrics.tasks.moved(None, Some(TaskState::Working));
        tracing::info!(task = %short(&id), status = "working", "task created");
        let guard = TaskGuard {
            tasks: Arc::clone(self),
            id,
            entry,
        };
        Ok((guard, rx))
    }

    // The live entry of `id` for `principal`.
    fn entry(&self, id: &str, principal: &str) -> Result<Arc<Entry>, ProxyError> {
        let entry = self.map.get(id).map(|e| Arc::clone(e.value()));
        entry
            .filter(|e| e.principal == principal && e.expires > Instant::now())
            .ok_or_else(unknown)
    }

    /// Whether `principal` may see task `id` (live, here, its own).
    pub(crate) fn visible(&self, id: &str, principal: &str) -> bool {
        self.entry(id, principal).is_ok()
    }

    /// `tasks/get`: the `DetailedTask` of `id`, as `principal` may see it.
    ///
    /// # Errors
    /// -32602 for an unknown or expired id, or another principal's.
    pub(crate) fn get(&self, id: &str, principal: &str) -> Result<Value, ProxyError> {
        let entry = self.entry(id, principal)?;
        let view = lock(&entry.view);
        Ok(view.detailed(id, entry.created, self.lifetime()))
    }

    /// `tasks/update`: takes the answers to outstanding requests (others are ignored: unknown,
    /// or answered already) and hands them to the task's actor; the task is `working` again once
    /// none is outstanding.
    ///
    /// # Errors
    /// -32602 for an unknown task, or an answer that does not fit what it answers (then none is
    /// taken).
    pub(crate) fn update(
        &self,
        id: &str,
        principal: &str,
        answers: &Map<String, Value>,
        (credentials, span): (&Credentials, tracing::Span),
    ) -> Result<(), ProxyError> {
        let entry = self.entry(id, principal)?;
        // A place in the actor's queue first: once answers are taken off the list, they must
        // reach it.
        let Ok(slot) = entry.control.try_reserve() else {
            return Err(ProxyError::Overloaded(
                "the task is busy; retry later".into(),
            ));
        };
        let taken = {
            let mut view = lock(&entry.view);
            let mut taken = Map::new();
            for asked in view.asked.iter().filter(|a| answers.contains_key(&a.key)) {
                let answer = &answers[&asked.key];
                asked.check(answer).map_err(|why| {
                    ProxyError::BadRetry(format!("inputResponses.{}: {why}", asked.key))
                })?;
                taken.insert(asked.key.clone(), answer.clone());
            }
            if taken.is_empty() {
                return Ok(());
            }
            view.asked.retain(|a| !taken.contains_key(&a.key));
            view.input_requests.retain(|k, _| !taken.contains_key(k));
            if view.input_requests.is_empty() && view.status == Status::InputRequired {
                self.set_status(id, &entry, &mut view, Status::Working);
            }
            view.updated = SystemTime::now();
            taken
        };
        self.changed(id);
        slot.send(Control::Answers(taken, credentials.clone(), span));
        Ok(())
    }

    /// `tasks/cancel`: asks the task's actor to cancel it (the status becomes `cancelled` when
    /// the upstream call is abandoned).
    ///
    /// # Errors
    /// -32602 for an unknown task or one already finished.
    pub(crate) fn cancel(&self, id: &str, principal: &str) -> Result<(), ProxyError> {
        let entry = self.entry(id, principal)?;
        if lock(&entry.view).status.is_terminal() {
            return Err(ProxyError::InvalidParams(
                "the task has already finished".into(),
            ));
        }
        // Full: a cancel or answers are queued already; the actor reads them in order.
        match entry.control.try_send(Control::Cancel) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => Err(ProxyError::Overloaded(
                "the task is busy; retry later".into(),
            )),
        }
    }

    /// Drops the tasks past their TTL (running ones were cancelled by their actor at that
    /// moment).
    pub(crate) fn sweep(&self) {
        let now = Instant::now();
        let expired: Vec<String> = self
            .map
            .iter()
            .filter(|e| e.expires <= now)
            .map(|e| e.key().clone())
            .collect();
        for id in expired {
            if let Some((_, entry)) = self.map.remove(&id) {
                // Dropped first, under the lock the end of a task takes: its running share is
                // released by whichever comes first, never by both.
                let status = {
                    let mut view = lock(&entry.view);
                    view.dropped = true;
                    view.status
                };
                self.release(&entry);
                self.metrics.tasks.moved(Some(state(status)), None);
                tracing::debug!(task = %short(&id), "task dropped at its TTL");
            }
        }
    }

    fn release(&self, entry: &Entry) {
        let bytes = entry.bytes.load(Ordering::Acquire);
        self.quota.release(&entry.principal, bytes);
    }

    fn lifetime(&self) -> Lifetime {
        Lifetime {
            ttl: self.config.ttl,
            poll_interval: self.config.poll_interval,
        }
    }

    // The one place a status changes: logged, counted.
    fn set_status(&self, id: &str, entry: &Entry, view: &mut View, to: Status) {
        let from = view.status;
        if from == to || from.is_terminal() {
            return;
        }
        view.status = to;
        self.metrics.tasks.moved(Some(state(from)), Some(state(to)));
        if to == Status::InputRequired {
            entry.rounds.fetch_add(1, Ordering::AcqRel);
        }
        if to.is_terminal() {
            // The call is over: what it held goes (the record stays charged until the TTL).
            entry.bytes.fetch_sub(RUNNING_TASK_BYTES, Ordering::AcqRel);
            self.quota.uncharge(RUNNING_TASK_BYTES);
            let rounds = u32::try_from(entry.rounds.load(Ordering::Acquire)).unwrap_or(u32::MAX);
            self.metrics.tasks.ended(entry.born.elapsed(), rounds);
        }
        tracing::info!(task = %short(id), from = from.as_str(), to = to.as_str(), "task status");
    }

    fn changed(&self, id: &str) {
        // No listener is the common case; a send error says only that.
        let _ = self.changes.send(Arc::from(id));
    }
}

impl TaskGuard {
    /// The `CreateTaskResult`'s task fields, as created.
    pub(crate) fn task(&self) -> Value {
        let view = lock(&self.entry.view);
        view.task(&self.id, self.entry.created, self.tasks.lifetime())
    }

    /// When the task's TTL runs out.
    pub(crate) fn deadline(&self) -> Instant {
        self.entry.expires
    }

    /// The upstream asked for more input: the requests join the outstanding ones (each with
    /// its key, unique over the task's life) and the task is `input_required`.
    pub(crate) fn ask(&self, asked: Asked, embedded: Value) {
        self.write(|view| {
            view.input_requests.insert(asked.key.clone(), embedded);
            view.asked.push(asked);
            Some(Status::InputRequired)
        });
    }

    /// The upstream withdrew the request under `key` (it cancelled it): it is no longer asked.
    pub(crate) fn withdraw(&self, key: &str) {
        self.write(|view| {
            view.asked.retain(|a| a.key != key);
            view.input_requests.remove(key);
            view.input_requests.is_empty().then_some(Status::Working)
        });
    }

    /// The upstream reported progress: `statusMessage` and `lastUpdatedAt`.
    pub(crate) fn progress(&self, message: Option<String>) {
        self.write(|view| {
            if message.is_some() {
                view.message = message;
            }
            None
        });
    }

    /// The upstream answered: the task is `completed` with `result` (JSON text).
    pub(crate) fn complete(&self, result: Box<RawValue>) {
        let extra = result.get().len();
        // Charged under the record's lock, and only to a task still held: the TTL sweep marks
        // a task dropped under it before it gives back what the task is charged.
        self.write(|view| {
            self.entry.bytes.fetch_add(extra, Ordering::AcqRel);
            self.tasks.quota.charge(extra);
            Self::ending(view, Ending::Result(result), None);
            Some(Status::Completed)
        });
    }

    /// The call ended with a JSON-RPC error: the task is `failed`.
    pub(crate) fn fail(&self, error: ErrorObject) {
        let message = Some(error.message.clone());
        self.end(Status::Failed, Ending::Error(error), message);
    }

    /// The task was cancelled (by the client, or at its TTL): `message` says which.
    pub(crate) fn cancelled(&self, message: &str) {
        self.write(|view| {
            view.message = Some(message.to_owned());
            view.asked.clear();
            view.input_requests.clear();
            Some(Status::Cancelled)
        });
    }

    /// The task's status now.
    pub(crate) fn status(&self) -> Status {
        lock(&self.entry.view).status
    }

    // Ends the task; `false` when it had ended already (or was dropped).
    fn end(&self, status: Status, ending: Ending, message: Option<String>) -> bool {
        self.write(|view| {
            Self::ending(view, ending, message);
            Some(status)
        })
    }

    // What a task keeps once it ends.
    fn ending(view: &mut View, ending: Ending, message: Option<String>) {
        view.ending = Some(ending);
        view.asked.clear();
        view.input_requests.clear();
        // The last progress message says nothing of a finished task.
        view.message = message;
    }

    // Changes the record under its lock (`f` says the status it moves to, if any), then tells
    // listeners. `false`: the task had ended (or was dropped), nothing changed.
    fn write(&self, f: impl FnOnce(&mut View) -> Option<Status>) -> bool {
        {
            let mut view = lock(&self.entry.view);
            if view.status.is_terminal() || view.dropped {
                return false;
            }
            if let Some(to) = f(&mut view) {
                self.tasks.set_status(&self.id, &self.entry, &mut view, to);
            }
            view.updated = SystemTime::now();
        }
        self.tasks.changed(&self.id);
        true
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        if !self.status().is_terminal() {
            self.fail(ErrorObject {
                code: crate::protocol::INTERNAL_ERROR,
                message: "the task ended without a result".into(),
                data: None,
            });
        }
    }
}

fn state(s: Status) -> TaskState {
    match s {
        Status::Working => TaskState::Working,
        Status::InputRequired => TaskState::InputRequired,
        Status::Completed => TaskState::Completed,
        Status::Failed => TaskState::Failed,
        Status::Cancelled => TaskState::Cancelled,
    }
}

// A poisoned lock only means a panic elsewhere while it was held; the record is still whole.
fn lock(m: &Mutex<View>) -> MutexGuard<'_, View> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What a log line names a task by: a digest, not the id (the id is a handle to the task).
fn short(id: &str) -> String {
    hex::encode(&Sha256::digest(id.as_bytes())[..6])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_is_everything_before_the_last_separator() {
        assert_eq!(owner_of("inst-1.abc"), Some("inst-1"));
        assert_eq!(owner_of("a.b.c"), Some("a.b"));
        assert_eq!(owner_of("nodot"), None);
        assert_eq!(owner_of(".abc"), None);
    }
}
