//! The pool sessions `subscriptions/listen` streams pin, per principal: a table of places, each
//! one session of one capability set and the listen streams that share it. A principal holds at
//! most `pool.max_listen_sessions_per_principal` places (a place being opened counts), so its
//! streams cannot pin every session of the pool; streams of one principal and capabilities share
//! a place. The pool decides how a stream gets one (`pool::listen`); this is the table.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

use super::session::{ListenerPin, Session};

/// Every principal's places.
#[derive(Debug)]
pub(crate) struct Pins {
    bound: PrincipalBound,
    places: Mutex<HashMap<String, Vec<Place>>>,
    next_id: AtomicU64,
    /// Woken when a place's session is known, or a place goes.
    changed: Notify,
}

/// One pinned session (or one being opened) and the streams on it.
#[derive(Debug)]
struct Place {
    id: u64,
    /// The pool key's capabilities text.
    capabilities: String,
    /// `None` while the first stream opens it.
    session: Option<Arc<Session>>,
    streams: usize,
}

/// What a listen stream of a principal and capabilities finds in the table.
pub(crate) enum Found<T> {
    /// A place of its capabilities whose session it may use (`use_session` said how): counted.
    Shared(Pin, Arc<Session>, T),
    /// Room for one more place, reserved for it: it opens the session and [`Pins::fill`]s it.
    Room(Pin),
    /// A place of its capabilities it cannot use yet (being opened, or its session busy) and no
    /// room for another: wait for a change and look again.
    Wait,
    /// The principal holds its bound of places, none of these capabilities.
    Full,
}

/// A listen stream's hold on its place; the place goes with its last stream.
#[derive(Debug)]
pub(crate) struct Pin {
    pins: Arc<Pins>,
    principal: String,
    id: u64,
    /// Keeps the session pinned in the pool (lent first, never reaped or evicted).
    listener: Option<ListenerPin>,
}

/// A bound on what each principal may hold, and the one of the principal that names no one
/// (every client without a principal header or token: everyone's, not one client's).
#[derive(Debug, Clone)]
pub(crate) struct PrincipalBound {
    each: usize,
    anonymous: usize,
    nobody: String,
}

impl PrincipalBound {
    /// `each` for a principal, `anonymous` for the principal that names no one (both at least 1).
    pub(crate) fn new(each: usize, anonymous: usize) -> Self {
        Self {
            each: each.max(1),
            anonymous: anonymous.max(1),
            nobody: crate::state::principal_digest(None),
        }
    }

    /// The bound of `principal` (a digest).
    pub(crate) fn of(&self, principal: &str) -> usize {
        if principal == self.nobody {
            self.anonymous
        } else {
            self.each
        }
    }
}

impl Pins {
    /// An empty table; each principal holds at most `bound.of(principal)` places.
    pub(crate) fn new(bound: PrincipalBound) -> Arc<Self> {
        Arc::new(Self {
            bound,
            places: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            changed: Notify::new(),
        })
    }

    /// The bound on `principal`'s places.
    pub(crate) fn bound(&self, principal: &str) -> usize {
        self.bound.of(principal)
    }

    /// Resolves at the next change of the table (enable it before looking).
    pub(crate) fn changed(&self) -> Notified<'_> {
        self.changed.notified()
    }

    /// Finds a place for a listen stream of `principal` with `capabilities`: a live place of
    /// these capabilities whose session `use_session` accepts (its answer is handed back), else
    /// room for a new place, else [`Found::Wait`] or [`Found::Full`]. Places whose session died
    /// are dropped first (their streams are ending).
    pub(crate) fn find<T>(
        self: &Arc<Self>,
        principal: &str,
        capabilities: &str,
        mut use_session: impl FnMut(&Arc<Session>) -> Option<T>,
    ) -> Found<T> {
        let mut all = self.lock();
        let places = all.entry(principal.to_owned()).or_default();
        places.retain(|p| p.session.as_ref().is_none_or(|s| !s.is_dead()));
        let mut same = places
            .iter_mut()
            .filter(|p| p.capabilities == capabilities)
            .peekable();
        let any_same = same.peek().is_some();
        let mut opening = false;
        for place in same {
            let Some(session) = &place.session else {
                opening = true;
                continue;
            };
            if let Some(used) = use_session(session) {
                place.streams += 1;
                let session = Arc::clone(session);
                let pin = self.pin(principal, place.id, Some(&session));
                return Found::Shared(pin, session, used);
            }
        }
        if !opening && places.len() < self.bound.of(principal) {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            places.push(Place {
                id,
                capabilities: capabilities.to_owned(),
                session: None,
                streams: 1,
            });
            return Found::Room(self.pin(principal, id, None));
        }
        if places.is_empty() {
            all.remove(principal);
        }
        if any_same {
            Found::Wait
        } else {
            Found::Full
        }
    }

    /// The session `pin`'s reserved place was opened with. When a place of the principal has
    /// that session already (the pool lent a pinned one), the stream joins it instead.
    pub(crate) fn fill(&self, pin: &mut Pin, session: &Arc<Session>) {
        {
            let mut all = self.lock();
            let places = all.entry(pin.principal.clone()).or_default();
            let joined = places
                .iter_mut()
                .find(|p| p.session.as_ref().is_some_and(|s| Arc::ptr_eq(s, session)));
            if let Some(place) = joined {
                place.streams += 1;
                let id = std::mem::replace(&mut pin.id, place.id);
                places.retain(|p| p.id != id);
            } else if let Some(place) = places.iter_mut().find(|p| p.id == pin.id) {
                place.session = Some(Arc::clone(session));
            }
        }
        pin.listener = Some(session.pin_listener());
        self.changed.notify_waiters();
    }

    /// Sessions pinned now, all principals together.
    pub(crate) fn pinned(&self) -> usize {
        self.lock()
            .values()
            .flatten()
            .filter(|p| p.session.as_ref().is_some_and(|s| !s.is_dead()))
            .count()
    }

    fn pin(self: &Arc<Self>, principal: &str, id: u64, session: Option<&Arc<Session>>) -> Pin {
        Pin {
            pins: Arc::clone(self),
            principal: principal.to_owned(),
            id,
            listener: session.map(Session::pin_listener),
        }
    }

    // A stream of place `id` of `principal` ended (or its place was never opened).
    fn release(&self, principal: &str, id: u64) {
        let mut all = self.lock();
        let Some(places) = all.get_mut(principal) else {
            return;
        };
        if let Some(i) = places.iter().position(|p| p.id == id) {
            places[i].streams -= 1;
            if places[i].streams == 0 {
                places.swap_remove(i);
            }
        }
        if places.is_empty() {
            all.remove(principal);
        }
        drop(all);
        self.changed.notify_waiters();
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<Place>>> {
        self.places
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.pins.release(&self.principal, self.id);
    }
}
