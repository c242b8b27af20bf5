//! What this process keeps of the tasks it holds, beside their records: each task's charge
//! against `[tasks]`' bounds (count, per principal, memory) and its mailbox, the channel to the
//! call actor that runs it. Neither goes into a store: a charge is this replica's memory, and
//! a mailbox is a channel into one of its tasks (a client message for a task another replica
//! holds is forwarded there first).

use std::time::{SystemTime, UNIX_EPOCH};

use dashmap::DashMap;
use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::record::{Change, Status, TaskRecord, Transition};
use crate::config;
use crate::error::ProxyError;
use crate::limits::Quota;
use crate::upstream::Credentials;

/// What a task is charged besides, while its call runs: the call's actor, its session and that
/// session's two upstream connections, what a parked call holds
/// ([`crate::config::PARKED_CALL_BYTES`]). `cargo bench --bench tasks` measured 76 KiB of RSS
/// per task waiting for input (500 tasks), against the 80 KiB this and the record's overhead
/// charge; a finished task holds its record and result only.
pub(crate) const RUNNING_TASK_BYTES: usize = crate::config::PARKED_CALL_BYTES;

/// What the client tells a running task, through the front.
#[derive(Debug)]
pub(crate) enum Control {
    /// `tasks/update`: answers to outstanding requests, each checked against what it answers,
    /// and what goes upstream with them (the update's own credentials). The span is the client
    /// span of their delivery upstream (ends once delivered). The actor says on `taken` once
    /// the task no longer lists them (the update is answered then).
    Answers {
        answers: Map<String, Value>,
        credentials: Credentials,
        span: tracing::Span,
        taken: oneshot::Sender<()>,
    },
    /// `tasks/cancel`.
    Cancel,
    /// Another instance holds the task now (it adopted it): stop this copy, writing nothing.
    Lost,
}

/// The tasks this process holds.
#[derive(Debug)]
pub(crate) struct Local {
    quota: Quota,
    held: DashMap<String, Held>,
    /// With a shared store, this instance's id: each task's record is copied here too, and
    /// written back under it to a store that lost it.
    copies_for: Option<String>,
    /// Tasks a request is adopting here now (see [`Local::adopting`]).
    adopting: DashMap<String, ()>,
}

/// A task being adopted here: others of its requests wait for nothing and adopt nothing while
/// this lives (dropped once the adopted task is held here, or the adoption ended otherwise).
#[derive(Debug)]
pub(crate) struct AdoptingHere<'a> {
    local: &'a Local,
    id: String,
}

impl Drop for AdoptingHere<'_> {
    fn drop(&mut self) {
        self.local.adopting.remove(&self.id);
    }
}

#[derive(Debug)]
struct Held {
    principal: String,
    bytes: usize,
    /// The status as its holder last wrote it (for the gauges when it is dropped).
    status: Status,
    /// When its TTL runs out: its charge goes then.
    expires: Instant,
    mailbox: mpsc::Sender<Control>,
    /// With a shared store: the record as its holder last wrote it, to write back to a store
    /// that lost it (restarted empty) or missed changes (down when they were made).
    copy: Option<TaskRecord>,
    /// The copy holds changes the store does not have yet.
    dirty: bool,
}

impl Local {
    /// Nothing held yet; `copies_for`: with a shared store, this instance's id (each task's
    /// record is copied here, to write back to a store that lost it).
    pub(crate) fn new(bounds: config::HeldBounds, copies_for: Option<String>) -> Self {
        Self {
            quota: Quota::new(bounds, "tasks"),
            held: DashMap::new(),
            copies_for,
            adopting: DashMap::new(),
        }
    }

    /// Marks task `id` as being adopted by this request, unless another request here is already
    /// adopting it (`None`): of several requests on this instance, one adopts, whatever the
    /// store's lease says meanwhile (it names this instance for all of them).
    pub(crate) fn adopting(&self, id: &str) -> Option<AdoptingHere<'_>> {
        match self.adopting.entry(id.to_owned()) {
            dashmap::mapref::entry::Entry::Occupied(_) => None,
            dashmap::mapref::entry::Entry::Vacant(v) => {
                v.insert(());
                Some(AdoptingHere {
                    local: self,
                    id: id.to_owned(),
                })
            }
        }
    }

    /// Whether each task's record is copied here.
    pub(crate) fn keeps_copies(&self) -> bool {
        self.copies_for.is_some()
    }

    /// Task `id`'s copy and the holder to write it back under, when it is held here with a
    /// shared store and its TTL has not run out.
    pub(crate) fn write_back(&self, id: &str) -> Option<(TaskRecord, &str)> {
        let held = self.held.get(id).filter(|h| h.expires > Instant::now())?;
        Some((held.copy.clone()?, self.copies_for.as_deref()?))
    }

    /// Bytes charged to tasks now.
    pub(crate) fn held_bytes(&self) -> usize {
        self.quota.held_bytes()
    }

    /// Charges a new task of `principal` `bytes` (its running share included).
    ///
    /// # Errors
    /// [`ProxyError::Overloaded`] past a bound; nothing is charged then.
    pub(crate) fn admit(&self, principal: &str, bytes: usize) -> Result<(), ProxyError> {
        self.quota.admit(principal, bytes)
    }

    /// Gives back what [`Local::admit`] charged, for a task that was not created after all.
    pub(crate) fn refund(&self, principal: &str, bytes: usize) {
        self.quota.release(principal, bytes);
    }

    /// Holds task `id` (admitted already) until `expires`; its actor reads `mailbox`.
    pub(crate) fn hold(
        &self,
        id: String,
        (principal, bytes): (&str, usize),
        expires: Instant,
        (mailbox, copy): (mpsc::Sender<Control>, Option<TaskRecord>),
    ) {
        let held = Held {
            principal: principal.to_owned(),
            bytes,
            status: copy.as_ref().map_or(Status::Working, |r| r.status),
            expires,
            mailbox,
            copy,
            dirty: false,
        };
        self.held.insert(id, held);
    }

    /// Task `id`'s copy (kept with a shared store) takes `change`, as the store's did (or,
    /// `dirty`, as the store will once it is written back): its new version and transition.
    pub(crate) fn mirror(
        &self,
        id: &str,
        (change, now_ms): (Change, u64),
        dirty: bool,
    ) -> Option<(u64, Option<Transition>)> {
        let mut held = self.held.get_mut(id)?;
        held.dirty |= dirty;
        let copy = held.copy.as_mut()?;
        let transition = copy.apply(change, now_ms);
        Some((copy.version, transition))
    }

    /// The copies holding changes the store does not have yet (it was down), with the holder
    /// to write them back under.
    pub(crate) fn dirty(&self) -> Vec<TaskRecord> {
        let now = Instant::now();
        (self.held.iter())
            .filter(|h| h.dirty && h.expires > now)
            .filter_map(|h| h.copy.clone())
            .collect()
    }

    /// Task `id`'s copy was written back: the store has every change.
    pub(crate) fn clean(&self, id: &str) {
        if let Some(mut held) = self.held.get_mut(id) {
            held.dirty = false;
        }
    }

    /// Whether task `id`'s copy holds changes the store does not have yet.
    pub(crate) fn is_dirty(&self, id: &str) -> bool {
        self.held.get(id).is_some_and(|h| h.dirty)
    }

    /// This instance's id, with a shared store.
    pub(crate) fn holder(&self) -> Option<&str> {
        self.copies_for.as_deref()
    }

    /// Whether this process holds task `id`.
    pub(crate) fn holds(&self, id: &str) -> bool {
        self.held.contains_key(id)
    }

    /// The tasks held here (running or finished) whose TTL has not run out: past it the store
    /// let them expire, and nothing renews or brings them back before the sweep drops them.
    pub(crate) fn ids(&self) -> Vec<String> {
        let now = Instant::now();
        (self.held.iter())
            .filter(|h| h.expires > now)
            .map(|h| h.key().clone())
            .collect()
    }

    /// The mailbox of task `id`, when this process holds it.
    pub(crate) fn mailbox(&self, id: &str) -> Option<mpsc::Sender<Control>> {
        self.held.get(id).map(|h| h.mailbox.clone())
    }

    /// Task `id` moved to `to`: a finished task's call no longer runs, so its running share
    /// goes (the record and result stay charged until the TTL). Nothing for a dropped task.
    pub(crate) fn moved(&self, id: &str, to: Status) {
        let Some(mut held) = self.held.get_mut(id) else {
            return;
        };
        let ended = to.is_terminal() && !held.status.is_terminal();
        held.status = to;
        if ended {
            held.bytes = held.bytes.saturating_sub(RUNNING_TASK_BYTES);
            self.quota.uncharge(RUNNING_TASK_BYTES);
        }
    }

    /// Charges task `id` `extra` bytes (its result), only while it is held: a dropped task's
    /// charge is given back whole once.
    pub(crate) fn charge(&self, id: &str, extra: usize) {
        if let Some(mut held) = self.held.get_mut(id) {
            held.bytes = held.bytes.saturating_add(extra);
            self.quota.charge(extra);
        }
    }

    /// Lets go of task `id` now (another instance holds it): its charge goes back. The status
    /// it had here, if it was held here.
    pub(crate) fn release(&self, id: &str) -> Option<Status> {
        let (_, held) = self.held.remove(id)?;
        self.quota.release(&held.principal, held.bytes);
        Some(held.status)
    }

    /// Lets go of the tasks past their TTL: their charges go back; returns the status each
    /// had, for the gauges.
    pub(crate) fn expire(&self, now: Instant) -> Vec<Status> {
        let mut gone = Vec::new();
        self.held.retain(|_, held| {
            if held.expires > now {
                return true;
            }
            self.quota.release(&held.principal, held.bytes);
            gone.push(held.status);
            false
        });
        gone
    }
}

/// Posts `control` to a task's actor. Full: client messages are queued already (the actor reads
/// them in order); closed: the task ended meanwhile, which its record says.
pub(crate) fn post(mailbox: &mpsc::Sender<Control>, control: Control) -> Result<(), ProxyError> {
    match mailbox.try_send(control) {
        Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => Ok(()),
        Err(mpsc::error::TrySendError::Full(_)) => Err(busy()),
    }
}

/// A task whose actor cannot take a message now.
pub(crate) fn busy() -> ProxyError {
    ProxyError::Overloaded("the task is busy; retry later".into())
}

/// Now, in milliseconds since the Unix epoch (the clock of task records).
pub(crate) fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
