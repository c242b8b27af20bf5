//! The change feed: list-changed and resource-updated notifications seen on any upstream session
//! (GET stream or a call's stream), each with the principal of its session, for
//! `subscriptions/listen` streams. Legacy servers notify a change on the session where it happened,
//! so listeners take changes from every session of their principal.
//!
//! Many servers notify every session of a change instead, and a principal with a thousand calls
//! parked holds a thousand sessions: one change would reach each listener a thousand times. The
//! feed publishes a notification once per principal within [`COALESCE_WINDOW`]; the copies the
//! other sessions bring are dropped. These notifications are level triggers (the client lists or
//! reads again), so a second real change inside the window is covered by the first notice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::broadcast;
use tokio::time::Instant;

/// Copies of one notification of one principal arriving within this are one change.
pub(crate) const COALESCE_WINDOW: Duration = Duration::from_millis(500);
/// Notifications remembered at most (older ones are forgotten first).
const MAX_RECENT: usize = 4096;

/// A list-changed or resource-updated notification seen on some upstream session, with the
/// principal (digest) that session belongs to.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    /// Principal digest of the session it came from.
    pub(crate) principal: Arc<str>,
    /// The notification as the upstream sent it.
    pub(crate) message: Bytes,
}

/// One session's end of the pool-wide change channel.
#[derive(Debug, Clone)]
pub(crate) struct ChangeFeed {
    /// The pool-wide channel.
    pub(crate) tx: broadcast::Sender<Change>,
    /// Principal digest of the session.
    pub(crate) principal: Arc<str>,
    /// What was published lately, pool-wide.
    pub(crate) recent: Arc<Recent>,
}

/// Notifications published lately, by principal and bytes.
#[derive(Debug, Default)]
pub(crate) struct Recent(Mutex<HashMap<(Arc<str>, Bytes), Instant>>);

impl Recent {
    // Whether `message` of `principal` is new (not published within the window); notes it.
    fn first(&self, principal: &Arc<str>, message: &Bytes, now: Instant) -> bool {
        let Ok(mut seen) = self.0.lock() else {
            return true;
        };
        let key = (Arc::clone(principal), message.clone());
        if seen
            .get(&key)
            .is_some_and(|t| now.duration_since(*t) < COALESCE_WINDOW)
        {
            return false;
        }
        if seen.len() >= MAX_RECENT {
            seen.retain(|_, t| now.duration_since(*t) < COALESCE_WINDOW);
        }
        if seen.len() < MAX_RECENT {
            seen.insert(key, now);
        }
        true
    }
}

impl ChangeFeed {
    /// Publishes `message` to the principal's listeners, unless a copy of it was (see the
    /// module docs).
    pub(crate) fn publish(&self, message: &Bytes) {
        if self.recent.first(&self.principal, message, Instant::now()) {
            // No receiver (nobody listening) is not an error.
            let _ = self.tx.send(Change {
                principal: Arc::clone(&self.principal),
                message: message.clone(),
            });
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_within_the_window_are_one_change_per_principal() {
        let recent = Recent::default();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        let msg =
            Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#);
        let other = Bytes::from_static(
            br#"{"jsonrpc":"2.0","method":"notifications/prompts/list_changed"}"#,
        );
        let t0 = Instant::now();
        assert!(recent.first(&a, &msg, t0));
        assert!(!recent.first(&a, &msg, t0 + Duration::from_millis(10)));
        assert!(
            recent.first(&b, &msg, t0),
            "another principal's listeners get theirs"
        );
        assert!(
            recent.first(&a, &other, t0),
            "another notification is another change"
        );
        assert!(
            recent.first(&a, &msg, t0 + COALESCE_WINDOW),
            "a change after the window"
        );
    }
}
