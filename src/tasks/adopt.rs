//! What adopting a task takes besides the lease (see `Tasks::route`): the parts of a
//! replay-safe task that run its call again here, and the failure of one that cannot.

use serde_json::{Map, Value};
use tokio::sync::mpsc;

use super::guard::{self, TaskGuard};
use super::local::{now_ms, Control};
use super::record::{CallJournal, Change, TaskRecord};
use super::store::{StoreError, TaskStore};
use crate::input::Asked;
use crate::jsonrpc::ErrorObject;
use crate::ops::metrics::{Adopted, Metrics};
use crate::state::replay;

/// Why a running task adopted from a lost replica failed: its tool is not replay-safe.
pub(super) const NOT_REPLAY_SAFE: &str =
    "the replica running this task was lost, and the tool is not \
                               marked safe to run again (see [replay]); call it again if that \
                               is safe";
/// Why a replay-safe task adopted from a lost replica failed: no room here to run it again.
pub(super) const NO_ROOM: &str =
    "the replica running this task was lost, and the one that took it over \
                       has no room to run it again; call the tool again";

/// A replay-safe task this instance adopted: what runs its call again.
#[derive(Debug)]
pub(crate) struct Rerun {
    /// The task's guard (its one writer from now on) and mailbox.
    pub(crate) guard: TaskGuard,
    /// See `guard`.
    pub(crate) mailbox: mpsc::Receiver<Control>,
    /// The request, and the answers given so far.
    pub(crate) call: CallJournal,
    /// Keys minted over the task's life (the re-run mints after them).
    pub(crate) keys_minted: u32,
    /// Its principal.
    pub(crate) principal: String,
}

/// Fails `record` (adopted here, running, not to run again) saying `why`: counted and logged
/// once, if it was still running.
pub(super) async fn fail(
    store: &dyn TaskStore,
    metrics: &Metrics,
    record: &TaskRecord,
    why: &str,
) -> Result<(), StoreError> {
    let id = record.id.as_str();
    let error = ErrorObject {
        code: crate::protocol::INTERNAL_ERROR,
        message: why.into(),
        data: None,
    };
    let failed = Change::Fail { error };
    let applied = match store.apply(id, record.version, failed, now_ms()).await {
        // Adopted meanwhile by another request: it says what became of the task.
        Err(StoreError::Conflict) => return Ok(()),
        applied => applied?,
    };
    if let Some(t) = applied.transition {
        metrics.tasks.adopted(Adopted::Failed);
        let (from, to) = (t.from.as_str(), t.to.as_str());
        tracing::info!(task = %guard::short(id), from, to, outcome = "failed", "task adopted");
    }
    Ok(())
}

/// Who adopts a task: the principal of the request that found it orphaned, and that request's
/// answers when it is a `tasks/update`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Adopting<'a> {
    pub(super) principal: &'a str,
    pub(super) answers: Option<&'a Map<String, Value>>,
    /// A `tasks/get`: served from the store while another request adopts the task here.
    pub(super) read: bool,
}

/// The answers `answers` gives to what `record` asks (each checked against what it answers), as
/// journal entries: the request that adopts the task brought them, and the call run again
/// takes them from the journal, so an acknowledged answer is never lost to the adoption.
pub(super) fn late_answers(
    record: &TaskRecord,
    answers: Option<&Map<String, Value>>,
) -> Vec<(String, Value)> {
    let Some(answers) = answers else {
        return Vec::new();
    };
    (record.input_requests.iter())
        .filter_map(|(key, embedded)| {
            let answer = answers.get(key)?;
            Asked::from_embedded(key, embedded)?.check(answer).ok()?;
            let method = embedded.get("method")?.as_str()?;
            let fingerprint = replay::fingerprint(method, embedded.get("params"));
            Some((fingerprint, answer.clone()))
        })
        .collect()
}
