//! A legacy client's own session upstream, where it cannot be relayed (a stdio or HTTP+SSE
//! upstream): a child or HTTP+SSE session of its own, opened with the client's own `initialize`
//! and then carried raw — the proxy passes on what each side says, and rewrites only the ids of
//! the client's requests (the link routes answers by its own integer ids).

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::client::UpstreamError;
use super::credentials::{Credentials, LiveCredentials};
use super::link::{Link, Routed};
use super::pool::{PoolKey, SessionPool};
use crate::jsonrpc::{Kind, Message};

/// A legacy client's session upstream. Holds a place in the pool (`max_processes` for stdio)
/// until dropped; the link is closed (the child stopped) by [`OwnSession::close`].
#[derive(Debug)]
pub(crate) struct OwnSession {
    /// The session's one stream each way.
    pub(crate) link: Arc<Link>,
    permit: std::sync::Mutex<Option<OwnedSemaphorePermit>>,
}

impl SessionPool {
    /// Opens a session for one legacy client: a place in the pool (evicting an idle modern
    /// session when full), the transport, then the client's `initialize` (`request`, sent with
    /// id `id`). Returns the session and the upstream's answer to it.
    ///
    /// # Errors
    /// [`UpstreamError::Busy`] when the pool stays full; the transport's errors; the upstream's
    /// silence past its timeout.
    pub(crate) async fn open_own(
        self: &Arc<Self>,
        id: i64,
        request: Vec<u8>,
        credentials: &Credentials,
    ) -> Result<(OwnSession, Bytes), UpstreamError> {
        // A key no idle session has: only a permit (or an eviction) can answer it.
        let key = PoolKey {
            principal: "\0own".into(),
            capabilities: Arc::from(""),
        };
        let permit = self.permit_for(&key).await?;
        let deadline = Instant::now() + self.client().timeout();
        let creds = LiveCredentials::new(credentials.clone());
        let link = self
            .connector()
            .open_link(self.client(), creds, deadline)
            .await?;
        let answered = async {
            let routed = link.request(id, request).await?;
            answer_of(routed).await
        };
        match tokio::time::timeout(self.client().timeout(), answered).await {
            Ok(Ok(answer)) => {
                let own = OwnSession {
                    link,
                    permit: std::sync::Mutex::new(Some(permit)),
                };
                Ok((own, answer))
            }
            Ok(Err(e)) => {
                link.close().await;
                Err(e)
            }
            Err(_) => {
                link.close().await;
                Err(UpstreamError::Timeout)
            }
        }
    }
}

impl OwnSession {
    /// Gives its place in the pool back (the upstream is gone: a child that died frees its
    /// place at once, not when the session is next looked at).
    pub(crate) fn release(&self) {
        if let Ok(mut p) = self.permit.lock() {
            p.take();
        }
    }

    /// Ends the session: the child is stopped and reaped, the HTTP+SSE stream dropped, the
    /// place given back.
    pub(crate) async fn close(&self) {
        self.link.close().await;
        self.release();
    }
}

// The answer among a request's routed messages (what comes before it, during a handshake, is
// dropped: the client has no stream open yet); `Closed` when the link closed first.
async fn answer_of(mut routed: Routed) -> Result<Bytes, UpstreamError> {
    while let Some(bytes) = routed.rx.recv().await {
        let is_answer = Message::parse(&bytes)
            .ok()
            .and_then(|m| m.kind().ok())
            .is_some_and(|k| k == Kind::Response);
        if is_answer {
            return Ok(bytes);
        }
    }
    Err(UpstreamError::Closed)
}
