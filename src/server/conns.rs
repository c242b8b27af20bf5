//! The connections of one listener: at most `max` open at once, and when a new one needs the
//! room, the connection that has been idle the longest (no request being answered, body
//! included) is shed first — a graceful close, which for an idle HTTP/1 keep-alive connection
//! is immediate and for HTTP/2 a GOAWAY. A connection that is answering something is never shed.
//!
//! Per request the cost is two atomic operations on the connection's own state; the table is
//! locked only when a connection opens or closes and when one is shed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::time::Instant;

/// The open connections of a listener.
#[derive(Debug)]
pub(super) struct Conns {
    open: Arc<Semaphore>,
    max: usize,
    table: Mutex<HashMap<u64, Arc<ConnState>>>,
    next_id: AtomicU64,
    /// Idle times are kept as microseconds since this instant.
    epoch: Instant,
}

/// One connection as the table sees it.
#[derive(Debug)]
pub(super) struct ConnState {
    busy: AtomicUsize,
    idle_since_us: AtomicU64,
    close: Notify,
}

/// An admitted connection: its slot, released (and its entry removed) when dropped.
#[derive(Debug)]
pub(super) struct Admitted {
    conns: Arc<Conns>,
    id: u64,
    state: Arc<ConnState>,
    _permit: OwnedSemaphorePermit,
}

/// One request being answered on a connection; the connection is idle again once every such
/// guard is dropped (the response body carries it, see `body::hold`).
#[derive(Debug)]
pub(super) struct Busy {
    state: Arc<ConnState>,
    epoch: Instant,
}

impl Conns {
    /// A table admitting `max` connections at once.
    pub(super) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            open: Arc::new(Semaphore::new(max)),
            max,
            table: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    /// A slot for a connection just accepted. When all are taken, the oldest idle connection
    /// is shed and the slot it frees taken; with none idle, this waits up to `wait` for a slot.
    /// Returns the slot and whether a connection was shed for it; `None` when no slot came.
    pub(super) async fn admit(self: &Arc<Self>, wait: Duration) -> Option<(Admitted, bool)> {
        let (permit, shed) = match Arc::clone(&self.open).try_acquire_owned() {
            Ok(p) => (p, false),
            Err(TryAcquireError::Closed) => return None,
            Err(TryAcquireError::NoPermits) => {
                let shed = self.shed_oldest_idle();
                let waited =
                    tokio::time::timeout(wait, Arc::clone(&self.open).acquire_owned()).await;
                (waited.ok()?.ok()?, shed)
            }
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ConnState {
            busy: AtomicUsize::new(0),
            idle_since_us: AtomicU64::new(self.now_us()),
            close: Notify::new(),
        });
        self.lock().insert(id, Arc::clone(&state));
        let admitted = Admitted {
            conns: Arc::clone(self),
            id,
            state,
            _permit: permit,
        };
        Some((admitted, shed))
    }

    /// Connections open now.
    pub(super) fn len(&self) -> usize {
        self.max - self.open.available_permits()
    }

    /// Asks every open connection to close gracefully (after the answers in flight).
    pub(super) fn close_all(&self) {
        for state in self.lock().values() {
            state.close.notify_one();
        }
    }

    /// Resolves once every connection has closed.
    pub(super) async fn all_closed(&self) {
        let n = u32::try_from(self.max).unwrap_or(u32::MAX);
        let _all = self.open.acquire_many(n).await;
    }

    // Signals the connection idle the longest to close; false when every one is busy.
    fn shed_oldest_idle(&self) -> bool {
        let table = self.lock();
        let oldest = table
            .values()
            .filter(|s| s.busy.load(Ordering::Acquire) == 0)
            .min_by_key(|s| s.idle_since_us.load(Ordering::Relaxed));
        match oldest {
            Some(s) => {
                s.close.notify_one();
                true
            }
            None => false,
        }
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<ConnState>>> {
        // A panic while holding this lock cannot leave the map half-updated (single inserts
        // and removes), so a poisoned lock is still usable.
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Admitted {
    /// Marks a request as being answered on this connection.
    pub(super) fn busy(&self) -> Busy {
        self.state.busy.fetch_add(1, Ordering::AcqRel);
        Busy {
            state: Arc::clone(&self.state),
            epoch: self.conns.epoch,
        }
    }

    /// Resolves when this connection should close (shed, or the server shutting down).
    pub(super) async fn close_requested(&self) {
        self.state.close.notified().await;
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.conns.lock().remove(&self.id);
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let now = u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.state.idle_since_us.store(now, Ordering::Relaxed);
        self.state.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_oldest_idle_connection_is_shed_and_a_busy_one_never() {
        let conns = Conns::new(3);
        let (a, _) = conns.admit(Duration::ZERO).await.unwrap();
        tokio::time::advance(Duration::from_millis(5)).await;
        let (b, _) = conns.admit(Duration::ZERO).await.unwrap();
        tokio::time::advance(Duration::from_millis(5)).await;
        let (c, _) = conns.admit(Duration::ZERO).await.unwrap();
        let _busy = a.busy();
        assert!(conns.shed_oldest_idle());
        // b has been idle longest (a is answering a request): b is asked to close.
        tokio::time::timeout(Duration::from_millis(1), b.close_requested())
            .await
            .expect("b is shed");
        assert!(
            tokio::time::timeout(Duration::from_millis(1), c.close_requested())
                .await
                .is_err(),
            "c is not"
        );
        assert_eq!(conns.len(), 3);
        drop((b, c));
        assert_eq!(conns.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_table_of_busy_connections_admits_nothing_within_the_wait() {
        let conns = Conns::new(1);
        let (a, _) = conns.admit(Duration::ZERO).await.unwrap();
        let _busy = a.busy();
        assert!(conns.admit(Duration::from_millis(50)).await.is_none());
        drop(_busy);
        // Idle now: the next admission sheds it and takes its slot once it has closed.
        let waiter = tokio::spawn({
            let conns = Arc::clone(&conns);
            async move {
                conns
                    .admit(Duration::from_secs(5))
                    .await
                    .map(|(_, shed)| shed)
            }
        });
        a.close_requested().await;
        drop(a);
        assert_eq!(waiter.await.unwrap(), Some(true));
    }
}
