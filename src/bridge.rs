//! Legacy clients in front of a stdio or HTTP+SSE upstream, which has no Streamable HTTP endpoint
//! to relay them to: the proxy is the legacy Streamable HTTP server they expect. Each client
//! session is an upstream session of its own ([`OwnSession`]: a child, or an HTTP+SSE session),
//! opened with the client's own `initialize` and named by an unguessable `Mcp-Session-Id` the
//! proxy issues, bound to the principal.
//!
//! What the upstream says goes where the link routes it: a request's answer, and the server
//! requests and notifications sent while it is open, to that request's SSE response; the rest
//! to the client's GET stream (held back, bounded, until one is open). What the client says goes
//! upstream as it came, but for its request ids, which the link needs as its own integers:
//! each request carries a proxy id upstream and its answer gets the client's back.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use futures_util::future::join_all;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::sync::lock;
use crate::upstream::{OwnSession, Owner, PrincipalBound, SinkFuture};

/// Messages held for a GET stream not open yet (the oldest go first past it).
const BACKLOG: usize = 64;
/// Longest a GET stream that does not read may hold up the upstream's reader.
const LISTENER_WAIT: Duration = Duration::from_secs(5);
/// Bytes of randomness in a session id.
const SESSION_ID_BYTES: usize = 16;

/// The legacy clients' own sessions on this instance, and the 2024-11-05 HTTP+SSE clients'.
#[derive(Debug)]
pub(crate) struct Bridge {
    sessions: DashMap<String, Arc<Bridged>>,
    sse: DashMap<String, Arc<SseClient>>,
    /// Sessions being opened, per principal: counted against the bound while they open.
    opening: Arc<DashMap<String, usize>>,
    idle: Duration,
    bound: PrincipalBound,
}

/// One legacy client's session.
#[derive(Debug)]
pub(crate) struct Bridged {
    principal: String,
    own: OwnSession,
    next_id: AtomicI64,
    /// The client's request ids in flight (their JSON text) → the ids they carry upstream.
    inflight: Mutex<HashMap<String, i64>>,
    listener: Mutex<Listener>,
    /// Open requests and GET streams: a session with any is not idle.
    busy: AtomicUsize,
    last_used: Mutex<Instant>,
    dead: AtomicBool,
}

#[derive(Debug, Default)]
struct Listener {
    tx: Option<mpsc::Sender<Bytes>>,
    backlog: VecDeque<Bytes>,
}

/// Why a session cannot be opened.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The principal holds as many as its bound (`server.max_legacy_sessions_per_principal`),
    /// given here, already.
    TooMany(usize),
}

impl Bridge {
    /// No sessions; each ends after `idle` unused; `bound.of(principal)` at once per principal.
    pub(crate) fn new(idle: Duration, bound: PrincipalBound) -> Self {
        Self {
            sessions: DashMap::new(),
            sse: DashMap::new(),
            opening: Arc::new(DashMap::new()),
            idle,
            bound,
        }
    }

    /// A place for one more session of `principal`, held until the returned guard drops (the
    /// session registered by then): concurrent opens cannot all pass the bound.
    pub(crate) fn admits(&self, principal: &str) -> Result<Opening, Refused> {
        let mut opening = self.opening.entry(principal.to_owned()).or_insert(0);
        let bound = self.bound.of(principal);
        if self.held(principal) + *opening >= bound {
            drop(opening);
            // A refused principal leaves no entry behind (in header mode they cost nothing).
            self.opening.remove_if(principal, |_, n| *n == 0);
            return Err(Refused::TooMany(bound));
        }
        *opening += 1;
        Ok(Opening {
            opening: Arc::clone(&self.opening),
            principal: principal.to_owned(),
        })
    }

    // Sessions `principal` holds now.
    fn held(&self, principal: &str) -> usize {
        let own = self
            .sessions
            .iter()
            .filter(|s| s.principal == principal && !s.is_dead())
            .count();
        // An HTTP+SSE client with its own upstream session is counted above.
        let relayed = self
            .sse
            .iter()
            .filter(|c| c.principal == principal && !matches!(c.backend(), Backend::Own(..)))
            .count();
        own + relayed
    }

    /// Registers the session `own` of `principal` and returns its id. The link's messages no
    /// request takes now go to its GET stream.
    pub(crate) fn register(&self, principal: &str, own: OwnSession) -> (String, Arc<Bridged>) {
        let id = crate::state::random_id(SESSION_ID_BYTES);
        let session = Arc::new(Bridged {
            principal: principal.to_owned(),
            own,
            next_id: AtomicI64::new(1),
            inflight: Mutex::new(HashMap::new()),
            listener: Mutex::new(Listener::default()),
            busy: AtomicUsize::new(0),
            last_used: Mutex::new(Instant::now()),
            dead: AtomicBool::new(false),
        });
        let owner: Arc<dyn Owner> = Arc::clone(&session) as Arc<dyn Owner>;
        session.own.link.attach(Arc::downgrade(&owner));
        self.sessions.insert(id.clone(), Arc::clone(&session));
        (id, session)
    }

    /// Session `id` of `principal`: `None` when unknown, ended, or another principal's (the
    /// client then gets 404 and initializes again).
    pub(crate) fn get(&self, id: &str, principal: &str) -> Option<Arc<Bridged>> {
        let session = self.sessions.get(id)?.clone();
        if session.is_dead() {
            self.sessions.remove(id);
            return None;
        }
        if session.principal != principal {
            return None;
        }
        session.touch();
        Some(session)
    }

    /// Ends session `id` of `principal` (the client's DELETE); false when it has none such.
    pub(crate) async fn end(&self, id: &str, principal: &str) -> bool {
        let Some(session) = self.get(id, principal) else {
            return false;
        };
        self.sessions.remove(id);
        session.close().await;
        true
    }

    /// Ends sessions idle past their time, and forgets those whose upstream is gone. Returns
    /// how many ended.
    pub(crate) async fn reap_idle(&self) -> usize {
        let idle = self.idle;
        let stale: Vec<(String, Arc<Bridged>)> = self
            .sessions
            .iter()
            .filter(|s| s.is_dead() || s.idle_for() >= idle)
            .map(|s| (s.key().clone(), Arc::clone(s.value())))
            .collect();
        for (id, _) in &stale {
            self.sessions.remove(id);
        }
        join_all(stale.iter().map(|(_, s)| s.close())).await;
        if !stale.is_empty() {
            tracing::debug!(ended = stale.len(), "ended idle legacy client sessions");
        }
        stale.len()
    }

    /// Sessions served now: clients' own upstream sessions, and HTTP+SSE streams without one.
    pub(crate) fn open(&self) -> usize {
        let streams = self
            .sse
            .iter()
            .filter(|c| !matches!(c.backend(), Backend::Own(..)))
            .count();
        self.sessions.len() + streams
    }

    /// A 2024-11-05 HTTP+SSE client's session of `principal`, whose stream reads `out`.
    pub(crate) fn open_sse(&self, principal: &str, out: mpsc::Sender<Bytes>) -> String {
        let id = crate::state::random_id(SESSION_ID_BYTES);
        let client = SseClient {
            principal: principal.to_owned(),
            out,
            backend: Mutex::new(Backend::None),
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_SSE_IN_FLIGHT)),
            elicits: AtomicBool::new(false),
            asked: Mutex::new(HashMap::new()),
        };
        self.sse.insert(id.clone(), Arc::new(client));
        id
    }

    /// HTTP+SSE session `id` of `principal`, while its stream is open.
    pub(crate) fn sse(&self, id: &str, principal: &str) -> Option<Arc<SseClient>> {
        let client = self.sse.get(id)?.clone();
        (client.principal == principal && !client.out.is_closed()).then_some(client)
    }

    /// The stream of HTTP+SSE session `id` ended: the session is forgotten (what was behind it
    /// is the caller's to end).
    pub(crate) fn close_sse(&self, id: &str) -> Option<Arc<SseClient>> {
        self.sse.remove(id).map(|(_, c)| c)
    }

    /// Ends every session (shutdown): children stopped and reaped, GET streams closed.
    pub(crate) async fn close_all(&self) {
        self.sse.clear();
        let all: Vec<Arc<Bridged>> = self
            .sessions
            .iter()
            .map(|s| Arc::clone(s.value()))
            .collect();
        self.sessions.clear();
        // At once: each child gets its grace to exit, not one after another.
        join_all(all.iter().map(|s| s.close())).await;
    }
}

/// A 2024-11-05 HTTP+SSE client's session: its one stream, and what is behind it.
#[derive(Debug)]
pub(crate) struct SseClient {
    principal: String,
    /// What the stream sends (JSON-RPC messages).
    pub(crate) out: mpsc::Sender<Bytes>,
    backend: Mutex<Backend>,
    /// Its messages being carried upstream: a POST is answered 202 at once, so this, not the
    /// connection, bounds what one client has in flight.
    pub(crate) in_flight: Arc<tokio::sync::Semaphore>,
    /// Whether its `initialize` declared form elicitation (the approval gate may ask it).
    elicits: AtomicBool,
    /// The proxy's own questions awaiting the client's answer: request id (JSON text) → who
    /// waits. Each holds one of `in_flight`'s permits while it waits, which bounds them.
    asked: Mutex<HashMap<String, oneshot::Sender<serde_json::Value>>>,
}

/// Messages one HTTP+SSE client may have in flight upstream; past it a POST gets 503.
pub(crate) const MAX_SSE_IN_FLIGHT: usize = 32;

/// What an HTTP+SSE client's session speaks to upstream: one backend per session, opened by
/// its one `initialize` and ended with its stream.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    /// Nothing yet: it has not initialized.
    None,
    /// Its `initialize` is on its way upstream.
    Opening,
    /// Its stream ended: it takes nothing more.
    Closed,
    /// A session of its own (stdio, HTTP+SSE upstream), in the bridge under this id.
    Own(String, Arc<Bridged>),
    /// A legacy session of a Streamable HTTP upstream: its `Mcp-Session-Id` and version.
    Relayed(Option<http::HeaderValue>, String),
}

impl SseClient {
    /// Whether the client's own upstream session behind it is gone.
    pub(crate) fn upstream_gone(&self) -> bool {
        matches!(self.backend(), Backend::Own(_, s) if s.is_dead())
    }

    /// What the session speaks to.
    pub(crate) fn backend(&self) -> Backend {
        lock(&self.backend).clone()
    }

    /// Takes the session's one `initialize`: `false` when it began one already, or its stream
    /// ended.
    pub(crate) fn begin(&self) -> bool {
        let mut backend = lock(&self.backend);
        let first = matches!(*backend, Backend::None);
        if first {
            *backend = Backend::Opening;
        }
        first
    }

    /// Its `initialize` failed: it may try again.
    pub(crate) fn reset(&self) {
        let mut backend = lock(&self.backend);
        if matches!(*backend, Backend::Opening) {
            *backend = Backend::None;
        }
    }

    /// It initialized: from now on it speaks to `backend`.
    ///
    /// # Errors
    /// `backend` back when the stream ended meanwhile: what it opened is the caller's to end.
    pub(crate) fn set_backend(&self, backend: Backend) -> Result<(), Backend> {
        let mut current = lock(&self.backend);
        if matches!(*current, Backend::Closed) {
            return Err(backend);
        }
        *current = backend;
        Ok(())
    }

    /// Its stream ended: what was behind it, the caller's to end (once: the session is
    /// [`Backend::Closed`] from now on).
    pub(crate) fn close(&self) -> Backend {
        lock(&self.asked).clear();
        std::mem::replace(&mut *lock(&self.backend), Backend::Closed)
    }

    /// Records whether its `initialize` declared form elicitation.
    pub(crate) fn set_elicits(&self, elicits: bool) {
        self.elicits.store(elicits, Ordering::Relaxed);
    }

    /// Whether its `initialize` declared form elicitation.
    pub(crate) fn elicits(&self) -> bool {
        self.elicits.load(Ordering::Relaxed)
    }

    /// Awaits the client's answer to the proxy's own request `key` (its id as JSON text).
    pub(crate) fn expect(&self, key: &str) -> oneshot::Receiver<serde_json::Value> {
        let (tx, rx) = oneshot::channel();
        lock(&self.asked).insert(key.to_owned(), tx);
        rx
    }

    /// Hands the client's answer `message` to the proxy's request `key`; `false` when none
    /// such waits (the message goes upstream then).
    pub(crate) fn answer(&self, key: &str, message: serde_json::Value) -> bool {
        match lock(&self.asked).remove(key) {
            Some(tx) => {
                let _ = tx.send(message);
                true
            }
            None => false,
        }
    }

    /// Stops awaiting `key` (given up).
    pub(crate) fn abandon(&self, key: &str) {
        lock(&self.asked).remove(key);
    }
}

impl Bridged {
    /// The upstream link.
    pub(crate) fn link(&self) -> &Arc<crate::upstream::Link> {
        &self.own.link
    }

    /// A fresh id for one of the client's requests upstream, remembered under the client's own.
    pub(crate) fn map_request(&self, client_id: &str) -> i64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.inflight).insert(client_id.to_owned(), id);
        id
    }

    /// The client's request `client_id` was answered (or abandoned).
    pub(crate) fn unmap(&self, client_id: &str) {
        lock(&self.inflight).remove(client_id);
    }

    /// The upstream id of the client's request `client_id`, while in flight.
    pub(crate) fn upstream_id(&self, client_id: &str) -> Option<i64> {
        lock(&self.inflight).get(client_id).copied()
    }

    /// Counts an open request or stream until the guard drops.
    pub(crate) fn hold(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::Relaxed);
        Busy(Arc::clone(self))
    }

    /// Opens the client's GET stream: what was held back first. `None` when one is open
    /// already (the spec allows the server to refuse a second).
    pub(crate) fn listen(&self, capacity: usize) -> Option<mpsc::Receiver<Bytes>> {
        let mut l = lock(&self.listener);
        if l.tx.as_ref().is_some_and(|tx| !tx.is_closed()) {
            return None;
        }
        let (tx, rx) = mpsc::channel(capacity.max(BACKLOG));
        while let Some(m) = l.backlog.pop_front() {
            let _ = tx.try_send(m);
        }
        l.tx = Some(tx);
        Some(rx)
    }

    /// Whether the upstream is gone or the session was ended.
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire) || self.own.link.is_closed()
    }

    async fn close(&self) {
        self.mark_dead();
        self.own.close().await;
    }

    fn mark_dead(&self) {
        self.dead.store(true, Ordering::Release);
        self.own.release();
        // The GET stream ends with its sender.
        lock(&self.listener).tx = None;
    }

    fn touch(&self) {
        *lock(&self.last_used) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        if self.busy.load(Ordering::Relaxed) > 0 {
            return Duration::ZERO;
        }
        lock(&self.last_used).elapsed()
    }

    // A message no request takes: to the GET stream, or held back for it.
    async fn to_listener(&self, message: Bytes) {
        let tx = {
            let mut l = lock(&self.listener);
            match &l.tx {
                Some(tx) if !tx.is_closed() => tx.clone(),
                _ => {
                    if l.backlog.len() >= BACKLOG {
                        l.backlog.pop_front();
                    }
                    l.backlog.push_back(message);
                    return;
                }
            }
        };
        if tokio::time::timeout(LISTENER_WAIT, tx.send(message))
            .await
            .is_err()
        {
            tracing::debug!("a legacy client's GET stream does not read; a message was dropped");
        }
    }
}

impl Owner for Bridged {
    fn unrouted(self: Arc<Self>, message: Bytes) -> SinkFuture<'static, ()> {
        Box::pin(async move { self.to_listener(message).await })
    }

    fn closed(&self) {
        self.mark_dead();
    }
}

/// A session of a principal being opened (see [`Bridge::admits`]).
#[derive(Debug)]
pub(crate) struct Opening {
    opening: Arc<DashMap<String, usize>>,
    principal: String,
}

impl Drop for Opening {
    fn drop(&mut self) {
        self.opening.remove_if_mut(&self.principal, |_, n| {
            *n = n.saturating_sub(1);
            *n == 0
        });
    }
}

/// Keeps a session from counting as idle.
#[derive(Debug)]
pub(crate) struct Busy(Arc<Bridged>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}
