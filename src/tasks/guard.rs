//! The call's side of a task: [`TaskGuard`], held by the call actor that runs the task, the
//! task's one writer. It turns what the call does into changes of the record (through the
//! store, with the version it last wrote), and the transitions they make into gauges, counters
//! and one log line each; this process's charge follows the status.

use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::local::{now_ms, Local};
use super::record::{Change, Status, TaskRecord, Transition};
use super::store::{StoreError, TaskStore};
use crate::jsonrpc::ErrorObject;
use crate::ops::metrics::{Metrics, TaskState};

/// Held by the call actor running the task: what it writes. Dropped before the task reached a
/// final status (the actor ended some other way), the task is marked failed.
#[derive(Debug)]
pub(crate) struct TaskGuard {
    store: Arc<dyn TaskStore>,
    local: Arc<Local>,
    metrics: Arc<Metrics>,
    id: String,
    /// The version of the record this guard last wrote (or created).
    version: u64,
    status: Status,
    /// Times it went from working to input_required.
    rounds: u32,
    born: Instant,
    deadline: Instant,
    /// The record is no longer this guard's to write: dropped at its TTL, or written by
    /// another holder.
    lost: bool,
    /// Writes the last word of a guard dropped early: when that fails too, nothing more is
    /// tried.
    last_word: bool,
}

impl TaskGuard {
    /// The guard of `record`, just stored or adopted; the task's TTL runs out at `deadline`.
    pub(crate) fn new(
        (store, local, metrics): (Arc<dyn TaskStore>, Arc<Local>, Arc<Metrics>),
        record: &TaskRecord,
        deadline: Instant,
    ) -> Self {
        metrics.tasks.moved(None, Some(state(record.status)));
        Self {
            store,
            local,
            metrics,
            id: record.id.clone(),
            version: record.version,
            status: record.status,
            rounds: record.rounds,
            born: Instant::now(),
            deadline,
            lost: false,
            last_word: false,
        }
    }

    /// When the task's TTL runs out.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The upstream asked for more input: listed under `key` (unique over the task's life),
    /// as the client sees it (`embedded`).
    pub(crate) async fn ask(&mut self, key: String, embedded: Value) {
        self.apply(Change::Ask { key, embedded }).await;
    }

    /// The upstream answered: the task is `completed` with `result` (JSON text), charged to
    /// this process until the TTL.
    pub(crate) async fn complete(&mut self, result: Box<RawValue>) {
        if self.writable() {
            self.local.charge(&self.id, result.get().len());
        }
        self.apply(Change::Complete { result }).await;
    }

    /// Writes `change`; a finished task, or one no longer this guard's, is left as it is.
    pub(crate) async fn apply(&mut self, change: Change) {
        if !self.writable() {
            return;
        }
        let now = now_ms();
        let mirrored = self.local.keeps_copies().then(|| change.clone());
        if self.local.is_dirty(&self.id) {
            self.catch_up().await;
        }
        let mut applied = self.store.apply(&self.id, self.version, change, now).await;
        if let (Err(StoreError::Unknown), Some(change)) = (&applied, &mirrored) {
            // A shared store that lost it (restarted empty): written back, then changed.
            if let Some((record, holder)) = self.local.write_back(&self.id) {
                if self.store.create(record, holder).await.is_ok() {
                    let change = change.clone();
                    applied = self.store.apply(&self.id, self.version, change, now).await;
                }
            }
        }
        match applied {
            Ok(a) => {
                if let Some(change) = mirrored.filter(|_| a.transition.is_some()) {
                    self.local.mirror(&self.id, (change, now), false);
                }
                self.version = a.version;
                if let Some(t) = a.transition {
                    self.moved(t);
                }
            }
            Err(StoreError::Unavailable(e)) if mirrored.is_some() => {
                // Kept in this instance's copy, written back once the store answers.
                tracing::warn!(task = %short(&self.id), error = %e, "task change kept here until the store answers");
                let change = mirrored.map(|c| (c, now));
                if let Some((version, t)) =
                    change.and_then(|c| self.local.mirror(&self.id, c, true))
                {
                    self.version = version;
                    if let Some(t) = t {
                        self.moved(t);
                    }
                }
            }
            Err(StoreError::Unknown) => {
                // Dropped at its TTL: nothing of it is written any more.
                self.lost = true;
            }
            Err(e) => {
                tracing::warn!(task = %short(&self.id), error = %e, "task change not written");
                if matches!(e, StoreError::Conflict) {
                    self.lost = true;
                }
            }
        }
    }

    // Writes back this task's copy, which holds changes the store missed while it was down.
    async fn catch_up(&mut self) {
        let Some((record, holder)) = self.local.write_back(&self.id) else {
            return;
        };
        if self.store.create(record, holder).await.is_ok() {
            self.local.clean(&self.id);
        }
    }

    /// Another instance holds the task now: this guard writes nothing more, and what this
    /// process charged for it goes back.
    pub(crate) fn let_go(&mut self) {
        self.lost = true;
        if let Some(status) = self.local.release(&self.id) {
            self.metrics.tasks.moved(Some(state(status)), None);
        }
    }

    fn writable(&self) -> bool {
        !self.lost && !self.status.is_terminal()
    }

    // A transition that took: gauges, this process's charge, the counters of a finished
    // task, one log line.
    fn moved(&mut self, t: Transition) {
        self.status = t.to;
        if t.from == t.to {
            return;
        }
        self.metrics
            .tasks
            .moved(Some(state(t.from)), Some(state(t.to)));
        self.local.moved(&self.id, t.to);
        if t.to == Status::InputRequired {
            self.rounds = self.rounds.saturating_add(1);
        }
        if t.to.is_terminal() {
            self.metrics.tasks.ended(self.born.elapsed(), self.rounds);
        }
        let (from, to) = (t.from.as_str(), t.to.as_str());
        tracing::info!(task = %short(&self.id), from, to, "task status");
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        if !self.writable() || self.last_word {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // Written by a guard of its own (the actor is gone), which never comes back here.
        let mut last = Self {
            store: Arc::clone(&self.store),
            local: Arc::clone(&self.local),
            metrics: Arc::clone(&self.metrics),
            id: std::mem::take(&mut self.id),
            last_word: true,
            ..*self
        };
        self.lost = true;
        runtime.spawn(async move {
            let error = ErrorObject {
                code: crate::protocol::INTERNAL_ERROR,
                message: "the task ended without a result".into(),
                data: None,
            };
            last.apply(Change::Fail { error }).await;
        });
    }
}

/// The metrics label of a status.
pub(crate) fn state(s: Status) -> TaskState {
    match s {
        Status::Working => TaskState::Working,
        Status::InputRequired => TaskState::InputRequired,
        Status::Completed => TaskState::Completed,
        Status::Failed => TaskState::Failed,
        Status::Cancelled => TaskState::Cancelled,
    }
}

/// What a log line names a task by: a digest, not the id (the id is a handle to the task).
pub(crate) fn short(id: &str) -> String {
    hex::encode(&Sha256::digest(id.as_bytes())[..6])
}
