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
