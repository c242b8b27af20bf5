//! A session for a `subscriptions/listen` stream: one the principal's streams of the same
//! capabilities pin already, shared, or a new one within `pool.max_listen_sessions_per_principal`
//! (the table is `upstream::pins`). A stream that subscribes upstream needs the session to itself
//! while it does (a stdio or HTTP+SSE session gives its server requests to the oldest request
//! open): it takes it when idle, and otherwise opens another within the bound, or waits for it.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Lease, PoolKey, SessionPool};
use crate::upstream::client::UpstreamError;
use crate::upstream::credentials::Credentials;
use crate::upstream::declared::Declared;
use crate::upstream::pins::{Found, Pin};
use crate::upstream::session::Session;

/// A listen stream's session, pinned for as long as the [`Pin`] lives.
#[derive(Debug)]
pub(crate) struct Listening {
    session: Arc<Session>,
    /// The session to this stream alone, until it has subscribed: when it opened the session,
    /// or when it asked for it (`exclusive`).
    lease: Option<Lease>,
    pin: Pin,
}

/// Why a listen stream gets no session.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The principal's streams pin `pool.max_listen_sessions_per_principal` sessions, none of
    /// these capabilities.
    Bound(usize),
    /// The pool or the upstream failed.
    Upstream(UpstreamError),
}

impl Listening {
    /// The session.
    pub(crate) fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// Whether the stream has the session to itself (it may subscribe on it).
    pub(crate) fn is_exclusive(&self) -> bool {
        self.lease.is_some()
    }

    /// The pin, once the stream is set up: the session goes back to the pool, pinned.
    pub(crate) fn into_pin(self) -> Pin {
        drop(self.lease);
        self.pin
    }
}

impl SessionPool {
    /// A pinned session for a listen stream of `principal` declaring `declared`; `exclusive`
    /// says whether the stream must have a session to itself while it sets up.
    ///
    /// # Errors
    /// [`Refused::Bound`] past the principal's bound; [`UpstreamError::Busy`] when the session it
    /// must share stays busy past `pool.acquire_timeout`; the errors of [`SessionPool::lease`].
    pub(crate) async fn listen(
        self: &Arc<Self>,
        principal: &str,
        declared: &Declared,
        credentials: &Credentials,
        exclusive: impl Fn(&Session) -> bool,
    ) -> Result<Listening, Refused> {
        let (key, mut hold) = self.admit(principal, declared);
        let deadline = Instant::now() + self.cfg.acquire_timeout;
        loop {
            let changed = self.pins.changed();
            let returned = self.returned.notified();
            tokio::pin!(changed, returned);
            changed.as_mut().enable();
            returned.as_mut().enable();
            let found = self.pins.find(principal, &key.capabilities, |s| {
                if !exclusive(s) {
                    return Some(None);
                }
                self.take_session(&key, s).map(Some)
            });
            let (pin, session, lease) = match found {
                Found::Shared(pin, session, lease) => (pin, session, lease),
                Found::Room(mut pin) => {
                    let lease = self
                        .lease_key(key.clone(), hold.take(), credentials)
                        .await
                        .map_err(Refused::Upstream)?;
                    self.pins.fill(&mut pin, lease.session());
                    (pin, Arc::clone(lease.session()), Some(lease))
                }
                Found::Full => return Err(Refused::Bound(self.pins.bound(principal))),
                Found::Wait => {
                    tokio::select! {
                        () = &mut changed => continue,
                        () = &mut returned => continue,
                        () = tokio::time::sleep_until(deadline) => {
                            let why = "the upstream session this principal's listen streams \
                                       share did not come free in time";
                            return Err(Refused::Upstream(UpstreamError::Busy(why)));
                        }
                    }
                }
            };
            session.renew_credentials(credentials);
            return Ok(Listening {
                session,
                lease,
                pin,
            });
        }
    }

    /// Sessions listen streams pin now.
    pub(crate) fn pinned_sessions(&self) -> usize {
        self.pins.pinned()
    }

    // Session `session` of `key`, when it is idle now: leased.
    fn take_session(self: &Arc<Self>, key: &PoolKey, session: &Arc<Session>) -> Option<Lease> {
        let mut idle = self.idle.lock().ok()?;
        let list = idle.get_mut(key)?;
        let i = list.iter().position(|s| Arc::ptr_eq(s, session))?;
        let session = list.remove(i);
        if list.is_empty() {
            idle.remove(key);
        }
        Some(Lease {
            session,
            key: key.clone(),
            pool: Arc::clone(self),
            reusable: true,
        })
    }
}
