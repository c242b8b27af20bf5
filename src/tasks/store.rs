//! The seam a task store goes behind: where task records live, who holds each task (the
//! replica whose call actor runs it), and the feed of changes. [`MemoryStore`] keeps them in
//! this process (one replica, today's behaviour); a store shared by replicas is a second
//! implementation of [`TaskStore`], not a change to its callers.
//!
//! A store only keeps records: it knows nothing of quotas, metrics, logs, call actors or the
//! client's answers (those stay with the process that holds the task, see `local`). Every
//! change goes through [`TaskStore::apply`] with the version its writer read, so that a writer
//! that is no longer the holder cannot overwrite the one that is.

use std::fmt;
use std::sync::Arc;

use dashmap::DashMap;
use futures_util::future::BoxFuture;
use tokio::sync::broadcast;

use super::record::{Change, TaskRecord, Transition};

/// What a store operation resolves to.
pub(crate) type StoreFuture<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

/// Why a store operation did not take.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    /// No such task (never created, or dropped at its TTL).
    #[error("no such task")]
    Unknown,
    /// The record changed since the writer read it: another holder writes it now.
    #[error("the task was changed by another holder")]
    Conflict,
    /// The store could not be reached, did not answer in time, or held what does not read.
    #[error("the task store is unavailable: {0}")]
    Unavailable(String),
}

/// A change that took: the record's new version, and what it did to the status (`None`: the
/// task had finished, nothing changed).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Applied {
    /// The version to name in the next change.
    pub(crate) version: u64,
    /// The status transition.
    pub(crate) transition: Option<Transition>,
}

/// What renewing a holder's leases found.
#[derive(Debug, Default)]
pub(crate) struct Renewal {
    /// Tasks another instance holds now.
    pub(crate) lost: Vec<String>,
    /// Tasks the store no longer has.
    pub(crate) missing: Vec<String>,
}

/// Where task records live. Futures borrow their arguments; no implementation holds a lock
/// across an `.await`.
pub(crate) trait TaskStore: Send + Sync + fmt::Debug {
    /// Stores a new record, held by instance `holder`; resolves once the store holds it (only
    /// then may the client be told the task exists).
    fn create<'a>(&'a self, record: TaskRecord, holder: &'a str) -> StoreFuture<'a, ()>;

    /// The record of task `id`, if the store has it.
    fn get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<TaskRecord>>;

    /// Applies `change` at `now_ms` to task `id`, if its version is still `version`.
    ///
    /// # Errors
    /// [`StoreError::Conflict`] when the record moved on since `version` was read.
    fn apply<'a>(
        &'a self,
        id: &'a str,
        version: u64,
        change: Change,
        now_ms: u64,
    ) -> StoreFuture<'a, Applied>;

    /// The instance that holds task `id` now (runs its call), if the store knows the task.
    fn holder<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<String>>;

    /// Renews `holder`'s lease on each of `ids` (taking it where none is held): which of them
    /// another instance holds now (their copy here must stop), and which the store no longer
    /// has (restarted empty: their holder writes them back).
    fn renew<'a>(&'a self, ids: &'a [String], holder: &'a str) -> StoreFuture<'a, Renewal>;

    /// Takes the lease on task `id` for `holder` when no one holds it: whether it was taken
    /// (of several instances racing, exactly one takes it).
    fn acquire<'a>(&'a self, id: &'a str, holder: &'a str) -> StoreFuture<'a, bool>;

    /// Whether the store answers now.
    fn ping(&self) -> StoreFuture<'_, ()>;

    /// Ids of tasks as they change (creation included), for `subscriptions/listen`.
    fn changes(&self) -> broadcast::Receiver<Arc<str>>;

    /// Drops the records past their expiry; resolves to how many went.
    fn sweep(&self, now_ms: u64) -> StoreFuture<'_, usize>;
}

/// Task changes a `subscriptions/listen` stream may fall behind by before it skips some.
const CHANGES_BUFFER: usize = 256;

/// The records in this process's memory: lost with it, seen by no other replica.
#[derive(Debug)]
pub(crate) struct MemoryStore {
    map: DashMap<String, Held>,
    changes: broadcast::Sender<Arc<str>>,
}

#[derive(Debug)]
struct Held {
    record: TaskRecord,
    holder: String,
}

impl MemoryStore {
    /// An empty store.
    pub(crate) fn new() -> Self {
        Self {
            map: DashMap::new(),
            changes: broadcast::channel(CHANGES_BUFFER).0,
        }
    }

    fn changed(&self, id: &str) {
        // No listener is the common case; a send error says only that.
        let _ = self.changes.send(Arc::from(id));
    }
}

impl TaskStore for MemoryStore {
    fn create<'a>(&'a self, record: TaskRecord, holder: &'a str) -> StoreFuture<'a, ()> {
        let id = record.id.clone();
        let holder = holder.to_owned();
        self.map.insert(id.clone(), Held { record, holder });
        self.changed(&id);
        Box::pin(std::future::ready(Ok(())))
    }

    fn get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<TaskRecord>> {
        let record = self.map.get(id).map(|h| h.record.clone());
        Box::pin(std::future::ready(Ok(record)))
    }

    fn apply<'a>(
        &'a self,
        id: &'a str,
        version: u64,
        change: Change,
        now_ms: u64,
    ) -> StoreFuture<'a, Applied> {
        let applied = match self.map.get_mut(id) {
            None => Err(StoreError::Unknown),
            Some(h) if h.record.version != version => Err(StoreError::Conflict),
            Some(mut h) => {
                let transition = h.record.apply(change, now_ms);
                Ok(Applied {
                    version: h.record.version,
                    transition,
                })
            }
        };
        if matches!(
            applied,
            Ok(Applied {
                transition: Some(_),
                ..
            })
        ) {
            self.changed(id);
        }
        Box::pin(std::future::ready(applied))
    }

    fn holder<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<String>> {
        let holder = self.map.get(id).map(|h| h.holder.clone());
        Box::pin(std::future::ready(Ok(holder)))
    }

    // One process: every task here is held here, for good.
    fn renew<'a>(&'a self, _ids: &'a [String], _holder: &'a str) -> StoreFuture<'a, Renewal> {
        Box::pin(std::future::ready(Ok(Renewal::default())))
    }

    fn acquire<'a>(&'a self, id: &'a str, holder: &'a str) -> StoreFuture<'a, bool> {
        let taken = self.map.get(id).is_some_and(|h| h.holder == holder);
        Box::pin(std::future::ready(Ok(taken)))
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn changes(&self) -> broadcast::Receiver<Arc<str>> {
        self.changes.subscribe()
    }

    fn sweep(&self, now_ms: u64) -> StoreFuture<'_, usize> {
        let before = self.map.len();
        self.map.retain(|_, h| h.record.expires_ms > now_ms);
        Box::pin(std::future::ready(Ok(before - self.map.len())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::record::{Lifetime, Status};

    fn record(id: &str) -> TaskRecord {
        let life = Lifetime {
            ttl_ms: 1_000,
            poll_interval_ms: 100,
        };
        TaskRecord::new(id.into(), "p".into(), 0, life)
    }

    #[tokio::test]
    async fn a_change_takes_only_against_the_version_it_read() {
        let store = MemoryStore::new();
        let mut changes = store.changes();
        store.create(record("i.a"), "i").await.unwrap();
        assert_eq!(&*changes.recv().await.unwrap(), "i.a");
        let cancel = || Change::Cancel {
            message: "m".into(),
        };
        let applied = store.apply("i.a", 0, cancel(), 5).await.unwrap();
        assert_eq!(applied.version, 1);
        assert_eq!(applied.transition.unwrap().to, Status::Cancelled);
        assert!(matches!(
            store.apply("i.a", 0, cancel(), 6).await,
            Err(StoreError::Conflict)
        ));
        assert!(matches!(
            store.apply("i.b", 0, cancel(), 6).await,
            Err(StoreError::Unknown)
        ));
        assert_eq!(store.holder("i.a").await.unwrap().as_deref(), Some("i"));
        assert_eq!(store.get("i.a").await.unwrap().unwrap().updated_ms, 5);
    }

    #[tokio::test]
    async fn records_go_at_their_expiry() {
        let store = MemoryStore::new();
        store.create(record("i.a"), "i").await.unwrap();
        assert_eq!(store.sweep(999).await.unwrap(), 0);
        assert_eq!(store.sweep(1_000).await.unwrap(), 1);
        assert!(store.get("i.a").await.unwrap().is_none());
    }
}
