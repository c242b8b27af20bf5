//! The change feed: list-changed and resource-updated notifications seen on any upstream session
//! (GET stream or a call's stream), each with the principal of its session, for
//! `subscriptions/listen` streams. Legacy servers notify a change on the session where it happened,
//! so listeners take changes from every session of their principal.
//!
//! Many servers notify a change on *every* session, and each parked call holds one: relayed as
//! they come, one change would reach each listener once per session. So the feed publishes a
//! notification (per principal, per exact message) once its copies stop coming: [`QUIET`] after
//! the last, at most [`MAX_DELAY`] after the first (copies spread wider go out again, as they
//! would without it). Nothing is lost by it: what is published comes after every copy it
//! stands for — a second, genuine change inside the burst included — and these notifications
//! only tell the client to look again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::broadcast;
use tokio::time::Instant;

/// A notification is published once no copy of it came for this long…
pub(crate) const QUIET: Duration = Duration::from_millis(50);
/// …or this long after its first copy, whichever is first.
pub(crate) const MAX_DELAY: Duration = Duration::from_millis(500);
/// Notifications held back at once at most; past it they are relayed as they come.
const MAX_BURSTS: usize = 4096;

/// A list-changed or resource-updated notification seen on some upstream session, with the
/// principal (digest) that session belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Change {
    /// Principal digest of the session it came from.
    pub(crate) principal: Arc<str>,
    /// The notification as the upstream sent it.
    pub(crate) message: Bytes,
}

/// The pool-wide change channel, with the copies of each notification held back until they stop.
#[derive(Debug)]
pub(crate) struct Changes {
    tx: broadcast::Sender<Change>,
    /// Each notification being held back, with when its latest copy came.
    bursts: Mutex<HashMap<Change, Instant>>,
}

impl Changes {
    /// A feed whose listeners may lag `backlog` notifications.
    pub(crate) fn new(backlog: usize) -> Arc<Self> {
        Arc::new(Self {
            tx: broadcast::channel(backlog).0,
            bursts: Mutex::default(),
        })
    }

    /// A listener's end.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.tx.subscribe()
    }

    /// `change` came on some session: the first copy starts a burst (published when it is
    /// over); later copies extend it.
    fn publish(self: &Arc<Self>, change: Change) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return self.send(change);
        };
        let now = Instant::now();
        {
            let mut bursts = self.bursts();
            if let Some(last) = bursts.get_mut(&change) {
                *last = now;
                return;
            }
            if bursts.len() >= MAX_BURSTS {
                drop(bursts);
                return self.send(change);
            }
            bursts.insert(change.clone(), now);
        }
        runtime.spawn(Arc::clone(self).publish_when_quiet(change, now));
    }

    // Waits until `change` has had no copy for `QUIET` (or `MAX_DELAY` passed since `first`),
    // then publishes it once.
    async fn publish_when_quiet(self: Arc<Self>, change: Change, first: Instant) {
        loop {
            let due = {
                let mut bursts = self.bursts();
                let Some(last) = bursts.get(&change) else {
                    return;
                };
                let due = (*last + QUIET).min(first + MAX_DELAY);
                if Instant::now() >= due {
                    bursts.remove(&change);
                    None
                } else {
                    Some(due)
                }
            };
            match due {
                Some(due) => tokio::time::sleep_until(due).await,
                None => return self.send(change),
            }
        }
    }

    fn send(&self, change: Change) {
        // No receiver (nobody listening) is not an error.
        let _ = self.tx.send(change);
    }

    fn bursts(&self) -> MutexGuard<'_, HashMap<Change, Instant>> {
        self.bursts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One session's end of the pool-wide change channel.
#[derive(Debug, Clone)]
pub(crate) struct ChangeFeed {
    /// The pool-wide channel.
    pub(crate) changes: Arc<Changes>,
    /// Principal digest of the session.
    pub(crate) principal: Arc<str>,
}

impl ChangeFeed {
    /// Publishes `message`, a change notification this session brought.
    pub(crate) fn publish(&self, message: &Bytes) {
        self.changes.publish(Change {
            principal: Arc::clone(&self.principal),
            message: message.clone(),
        });
    }
}

/// Whether `method` is a change notification `subscriptions/listen` streams carry.
pub(crate) fn is_change(method: &str) -> bool {
    matches!(
        method,
        "notifications/tools/list_changed"
            | "notifications/prompts/list_changed"
            | "notifications/resources/list_changed"
            | "notifications/resources/updated"
    )
}
