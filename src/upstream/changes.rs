//! The change feed: list-changed and resource-updated notifications seen on any upstream session
//! (GET stream or a call's stream), each with the principal of its session, for
//! `subscriptions/listen` streams. Legacy servers notify a change on the session where it happened,
//! so listeners take changes from every session of their principal.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::broadcast;

/// A list-changed or resource-updated notification seen on some upstream session, with the
/// principal (digest) that session belongs to.
#[derive(Debug, Clone)]
pub struct Change {
    /// Principal digest of the session it came from.
    pub principal: Arc<str>,
    /// The notification as the upstream sent it.
    pub message: Bytes,
}

/// One session's end of the pool-wide change channel.
#[derive(Debug, Clone)]
pub struct ChangeFeed {
    /// The pool-wide channel.
    pub tx: broadcast::Sender<Change>,
    /// Principal digest of the session.
    pub principal: Arc<str>,
}

/// Whether `method` is a change notification `subscriptions/listen` streams carry.
pub fn is_change(method: &str) -> bool {
    matches!(
        method,
        "notifications/tools/list_changed"
            | "notifications/prompts/list_changed"
            | "notifications/resources/list_changed"
            | "notifications/resources/updated"
    )
}
