//! The bounded pool of legacy sessions, keyed by (principal digest, declared capabilities: the
//! request's `Declared` text, its extensions included while its principal's sessions carry no
//! more than `pool.max_extension_sets_per_principal` declarations, see `upstream::declared`).
//!
//! Every request leases a session exclusively for its lifetime, so a server request arriving on
//! the session's GET stream belongs to exactly one call. A healthy lease goes back to the idle list
//! when dropped; a poisoned or dead one is closed. Idle sessions are reaped after `idle_timeout`,
//! but for those listen streams pin (`listen`: a share per principal, see `upstream::pins`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{broadcast, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::changes::{Change, ChangeFeed, Changes};
use super::client::{UpstreamClient, UpstreamError};
use super::connect::Connector;
use super::credentials::{Credentials, LiveCredentials};
use super::declared::{Declared, ExtensionHold, ExtensionSets};
use super::pins::{Pins, PrincipalBound};
use super::session::{Session, SessionParams};
use crate::config::{self, UpstreamTransport};
use crate::ops::metrics::{Limit, Metrics};

mod idle;
pub(crate) mod listen;

/// Sessions are shared only between requests with the same key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PoolKey {
    /// Principal digest.
    pub(crate) principal: String,
    /// Canonical JSON of the declared (legacy-mapped) capabilities ([`Declared`]): shared, so
    /// that a lease and its return clone no text.
    pub(crate) capabilities: Arc<str>,
}

/// The session pool.
#[derive(Debug)]
pub(crate) struct SessionPool {
    client: UpstreamClient,
    connector: Connector,
    /// `[pool]`: bounds and timeouts.
    cfg: config::Pool,
    /// Sessions at most: `pool.max_sessions`, or a stdio upstream's `max_processes`.
    max_sessions: usize,
    /// Protocol version asked for in `initialize`.
    protocol_version: String,
    /// Answer to unattributed `roots/list`.
    default_roots: Arc<Vec<Value>>,
    idle: Mutex<HashMap<PoolKey, Vec<Arc<Session>>, foldhash::fast::RandomState>>,
    permits: Arc<Semaphore>,
    ready: AtomicBool,
    /// Change notifications from every session, for `subscriptions/listen`.
    changes: Arc<Changes>,
    /// Woken when a session goes back to idle (a waiting lease may take or evict it).
    returned: Notify,
    /// Leases waiting in [`SessionPool::acquire`].
    waiters: AtomicUsize,
    /// Sessions being closed after their lease ended (shutdown waits for their DELETE).
    closing: TaskTracker,
    /// The sessions listen streams pin, per principal (`pool.max_listen_sessions_per_principal`).
    pins: Arc<Pins>,
    /// The extension declarations sessions carry, per principal
    /// (`pool.max_extension_sets_per_principal`).
    extension_sets: Arc<ExtensionSets>,
    /// Counts a request served without its extensions (past that bound).
    metrics: Arc<Metrics>,
}

enum Acquired {
    Idle(Arc<Session>),
    Permit(OwnedSemaphorePermit),
}

// Counts a waiting lease for as long as it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn count(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::Relaxed);
        Self(n)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How many change notifications a slow listen stream may fall behind before it skips some
/// (list-changed notifications are level triggers: a skipped one is covered by a later one).
const CHANGE_BACKLOG: usize = 1024;

/// Exclusive use of one session; returned to the pool on drop.
#[derive(Debug)]
pub(crate) struct Lease {
    session: Arc<Session>,
    key: PoolKey,
    pool: Arc<SessionPool>,
    reusable: bool,
}

impl SessionPool {
    /// An empty pool; `listen` bounds the sessions each principal's listen streams pin.
    pub(crate) fn new(
        upstream: &config::Upstream,
        cfg: config::Pool,
        listen: PrincipalBound,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let client = UpstreamClient::new(
            upstream.url.clone(),
            upstream.timeout,
            upstream.max_sse_event_bytes,
            upstream.max_idle_connections,
        );
        // A stdio upstream is as many sessions as it may have children.
        let max_sessions = match &upstream.transport {
            UpstreamTransport::Stdio(cmd) => cmd.max_processes,
            _ => cfg.max_sessions,
        };
        let permits = Arc::new(Semaphore::new(max_sessions));
        let pins = Pins::new(listen);
        let extension_sets =
            ExtensionSets::new(cfg.max_extension_sets_per_principal, cfg.idle_timeout);
        Arc::new(Self {
            client,
            connector: Connector::new(upstream.transport.clone()),
            max_sessions,
            protocol_version: upstream.protocol_version.clone(),
            default_roots: Arc::new(upstream.default_roots.clone()),
            cfg,
            idle: Mutex::new(HashMap::default()),
            permits,
            ready: AtomicBool::new(false),
            changes: Changes::new(CHANGE_BACKLOG),
            returned: Notify::new(),
            waiters: AtomicUsize::new(0),
            closing: TaskTracker::new(),
            pins,
            extension_sets,
            metrics,
        })
    }

    /// Change notifications (list-changed, resource-updated) from every upstream session, each
    /// with its session's principal digest.
    pub(crate) fn subscribe_changes(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    /// True once any `initialize` succeeded, while the upstream stays reachable (a stdio
    /// server: while it starts).
    pub(crate) fn is_ready(&self) -> bool {
        let up = if self.connector.is_network() {
            self.client.is_reachable()
        } else {
            self.connector.is_starting_well()
        };
        self.ready.load(Ordering::Relaxed) && up
    }

    /// The periodic liveness check readiness follows between requests: for a network
    /// upstream, an answer within `recently`, else a TCP connect; for a stdio server, whether
    /// its last start worked.
    pub(crate) async fn check_health(&self, recently: Duration) -> bool {
        if self.connector.is_network() {
            self.client.check_connect(recently).await
        } else {
            self.connector.is_starting_well()
        }
    }

    /// Whether the upstream has an HTTP origin (OAuth metadata can be relayed from it).
    pub(crate) fn has_origin(&self) -> bool {
        self.connector.is_network()
    }

    /// Whether legacy clients can be relayed to this upstream (a Streamable HTTP one only).
    pub(crate) fn relays_legacy_clients(&self) -> bool {
        self.connector.relays_legacy_clients()
    }

    /// Whether legacy clients can be relayed, finding out first (one handshake) when the
    /// transport is `auto` and not known yet: a legacy client arriving before the readiness
    /// probe must not be relayed to an HTTP+SSE URL.
    pub(crate) async fn relays_legacy_clients_now(self: &Arc<Self>) -> bool {
        if self.connector.undetected() {
            self.probe().await;
        }
        self.relays_legacy_clients()
    }

    /// The upstream's transport, for logs (`auto` says what it found).
    pub(crate) fn transport_name(&self) -> &'static str {
        self.connector.name()
    }

    /// The upstream client.
    pub(crate) fn client(&self) -> &UpstreamClient {
        &self.client
    }

    /// Leases a session for `principal` declaring `declared`, creating one if needed.
    ///
    /// # Errors
    /// [`UpstreamError::Busy`] when the pool stays full; the errors of the handshake.
    pub(crate) async fn lease(
        self: &Arc<Self>,
        principal: &str,
        declared: &Declared,
        credentials: &Credentials,
    ) -> Result<Lease, UpstreamError> {
        let (key, hold) = self.admit(principal, declared);
        self.lease_key(key, hold, credentials).await
    }

    // The key a request declaring `declared` is served under, with the hold a new session of
    // it keeps on its extension declaration. Past the principal's bound of declarations the
    // request is served as if it declared no extension: a client sending a new declaration per
    // request cannot make a session per request, and a declaring client never gets more than
    // it declared.
    fn admit(&self, principal: &str, declared: &Declared) -> (PoolKey, Option<ExtensionHold>) {
        let key = |capabilities| PoolKey {
            principal: principal.to_owned(),
            capabilities,
        };
        let Some(extensions) = declared.extensions() else {
            return (key(declared.shared_text()), None);
        };
        match self.extension_sets.hold(principal, extensions) {
            Some(hold) => (key(declared.shared_text()), Some(hold)),
            None => {
                self.metrics.limit_hit(Limit::ExtensionSets);
                tracing::debug!(
                    "a principal's sessions carry pool.max_extension_sets_per_principal = {} \
                     extension declarations; a request is served without its extensions",
                    self.cfg.max_extension_sets_per_principal
                );
                (key(Arc::from(declared.text_without_extensions())), None)
            }
        }
    }

    // Leases a session of `key`; a new one keeps `hold`.
    async fn lease_key(
        self: &Arc<Self>,
        key: PoolKey,
        hold: Option<ExtensionHold>,
        credentials: &Credentials,
    ) -> Result<Lease, UpstreamError> {
        let deadline = Instant::now() + self.cfg.acquire_timeout;
        let permit = match self.acquire(&key).await? {
            Acquired::Idle(session) => {
                session.renew_credentials(credentials);
                return Ok(Lease {
                    session,
                    key,
                    pool: Arc::clone(self),
                    reusable: true,
                });
            }
            Acquired::Permit(p) => p,
        };
        let params = SessionParams {
            // The key's text, written from valid JSON values: it parses.
            capabilities: serde_json::from_str(&key.capabilities)
                .unwrap_or_else(|_| serde_json::json!({})),
            credentials: LiveCredentials::new(credentials.clone()),
            protocol_version: self.protocol_version.clone(),
            default_roots: Arc::clone(&self.default_roots),
            changes: ChangeFeed {
                changes: Arc::clone(&self.changes),
                principal: Arc::from(key.principal.as_str()),
            },
            extensions: hold,
        };
        // Boxed: a session is opened once and leased many times; its handshake's future would
        // otherwise be carried (and moved) in every lease's.
        let opened = Box::pin(self.connector.open(&self.client, params, permit, deadline)).await;
        let session = match opened {
            Ok(s) => s,
            // Refusing these credentials is an answer too: the upstream is up.
            Err(e @ UpstreamError::Unauthorized { .. }) => {
                self.ready.store(true, Ordering::Relaxed);
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        self.ready.store(true, Ordering::Relaxed);
        Ok(Lease {
            session,
            key,
            pool: Arc::clone(self),
            reusable: true,
        })
    }

    // An idle session of `key`, or a permit for a new one. When the pool is full, waits (up to
    // the acquire timeout) for whichever comes first: a permit, or a session coming back idle, in
    // which case it takes it (same key) or evicts the least recently used idle session (any key,
    // never one a listen stream relies on) so that its permit comes free.
    async fn acquire(&self, key: &PoolKey) -> Result<Acquired, UpstreamError> {
        if let Some(session) = self.take_idle(key) {
            return Ok(Acquired::Idle(session));
        }
        if let Ok(p) = Arc::clone(&self.permits).try_acquire_owned() {
            return Ok(Acquired::Permit(p));
        }
        // Boxed: only a full pool waits, and its wait is most of this future.
        Box::pin(self.acquire_waiting(key)).await
    }

    // `acquire` once neither an idle session nor a permit was at hand.
    async fn acquire_waiting(&self, key: &PoolKey) -> Result<Acquired, UpstreamError> {
        let deadline = Instant::now() + self.cfg.acquire_timeout;
        let mut waiting = None;
        loop {
            let returned = self.returned.notified();
            tokio::pin!(returned);
            returned.as_mut().enable();
            if let Some(session) = self.take_idle(key) {
                return Ok(Acquired::Idle(session));
            }
            if let Ok(p) = Arc::clone(&self.permits).try_acquire_owned() {
                return Ok(Acquired::Permit(p));
            }
            self.evict_one_idle().await;
            waiting.get_or_insert_with(|| Waiting::count(&self.waiters));
            tokio::select! {
                p = Arc::clone(&self.permits).acquire_owned() => {
                    return p
                        .map(Acquired::Permit)
                        .map_err(|_| UpstreamError::Busy("the session pool is closed"));
                }
                () = &mut returned => {}
                () = tokio::time::sleep_until(deadline) => {
                    return Err(UpstreamError::Busy("all upstream sessions are busy"));
                }
            }
        }
    }

    /// Sessions open now, leased or idle (each holds a permit).
    pub(crate) fn open_sessions(&self) -> usize {
        self.max_sessions
            .saturating_sub(self.permits.available_permits())
    }

    /// Requests waiting for an upstream session (the pool is full and nothing idle fits).
    pub(crate) fn waiters(&self) -> usize {
        self.waiters.load(Ordering::Relaxed)
    }

    /// Runs one handshake (and closes it) to learn whether the upstream is up; sets readiness.
    pub(crate) async fn probe(self: &Arc<Self>) -> bool {
        match self
            .lease("", &Declared::nothing(), &Credentials::default())
            .await
        {
            Ok(mut lease) => {
                // Closed (DELETE) when dropped; the probe's session is not kept, except a stdio
                // child, which stays warm for the next request.
                if self.connector.is_network() {
                    lease.poison();
                }
                true
            }
            // The probe has no credentials: an upstream that asks for them is up.
            Err(UpstreamError::Unauthorized { .. }) => true,
            Err(_) => false,
        }
    }

    /// Closes every session (shutdown): the idle ones, and waits (at most `timeout`) for those
    /// whose leases ended to finish closing.
    pub(crate) async fn close_all(&self, timeout: Duration) {
        let all: Vec<Arc<Session>> = match self.idle.lock() {
            Ok(mut idle) => idle.drain().flat_map(|(_, v)| v).collect(),
            Err(_) => Vec::new(),
        };
        for s in all {
            self.closing.spawn(async move { s.close().await });
        }
        self.closing.close();
        if tokio::time::timeout(timeout, self.closing.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                sessions = self.closing.len(),
                "upstream sessions did not close in time"
            );
        }
    }

    /// A place in the pool for a session outside it (a legacy client's own), evicting an idle
    /// one when full; `key` must be one no idle session has.
    pub(super) async fn permit_for(
        &self,
        key: &PoolKey,
    ) -> Result<OwnedSemaphorePermit, UpstreamError> {
        match self.acquire(key).await? {
            Acquired::Permit(p) => Ok(p),
            Acquired::Idle(session) => {
                self.give_back(key.clone(), session);
                Err(UpstreamError::Busy("all upstream sessions are busy"))
            }
        }
    }

    /// How sessions are opened.
    pub(super) fn connector(&self) -> &Connector {
        &self.connector
    }
}

impl Lease {
    /// The leased session.
    pub(crate) fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// Do not reuse this session (e.g. a cancelled call may still talk on it); it is closed on drop.
    pub(crate) fn poison(&mut self) {
        self.reusable = false;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.session.set_inbox(None);
        if self.reusable && !self.session.is_dead() {
            self.pool
                .give_back(self.key.clone(), Arc::clone(&self.session));
            return;
        }
        let session = Arc::clone(&self.session);
        if tokio::runtime::Handle::try_current().is_ok() {
            self.pool
                .closing
                .spawn(async move { session.close().await });
        }
    }
}

#[cfg(test)]
mod tests;
