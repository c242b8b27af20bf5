//! The one shared state, built from a validated config: the session pool, the token codec,
//! what every call actor shares (registry, settings), the peers, metrics and the shutdown flag.
//! Everything the request path needs hangs off one `Arc<App>`; `server` serves it, `front`
//! reads it.

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use crate::auth::{AuthSetupError, Authenticator};
use crate::bridge::Bridge;
use crate::call::{CallContext, Gather, ParkedCalls};
use crate::cluster::Peers;
use crate::config::Config;
use crate::inline_asks::InlineAsks;
use crate::limits::PrincipalGate;
use crate::ops::metrics::Metrics;
use crate::state::keys::{self, KeyError, KeySet};
use crate::state::{principal_digest, random_id, SpentTokens, TokenCodec};
use crate::tasks::Tasks;
use crate::upstream::{Credentials, Declared, PrincipalBound, SessionPool};

/// Pages of `tools/list` read to check `[approval.tools]` against the upstream.
const POLICY_CHECK_PAGES: usize = 20;
/// How long that check may take.
const POLICY_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// Bytes of randomness in a generated instance id.
const INSTANCE_ID_BYTES: usize = 9;

/// This instance's id: `state.instance_id`, or a random one written there (once; the app, its
/// tokens and its exported traces' `service.instance.id` all use the same).
pub fn fix_instance_id(state: &mut crate::config::State) -> String {
    state
        .instance_id
        .get_or_insert_with(|| random_id(INSTANCE_ID_BYTES))
        .clone()
}

/// Everything a request needs, shared behind one `Arc`.
#[derive(Debug)]
pub struct App {
    /// Validated configuration.
    pub(crate) config: Config,
    /// Legacy session pool (and the upstream client inside it).
    pub(crate) pool: Arc<SessionPool>,
    /// What every call actor shares: the registry of parked calls, the token codec, settings.
    pub(crate) calls: Arc<CallContext>,
    /// Counters for `/metrics`.
    pub(crate) metrics: Arc<Metrics>,
    /// Requests in flight per principal (`server.max_requests_per_principal`).
    pub(crate) principals: Arc<PrincipalGate>,
    /// Flips to `true` when shutdown begins: readiness off, no new long-lived work, listen
    /// streams end; parked calls may still be resumed.
    pub(crate) draining: watch::Sender<bool>,
    /// Flips to `true` when the drain is over; call actors then cancel their upstream calls.
    pub(crate) shutdown: watch::Sender<bool>,
    /// The requestState codec: signs what calls park behind, verifies retries, signs and
    /// checks what peers send each other.
    pub(crate) tokens: Arc<TokenCodec>,
    /// The other replicas, for retries whose requestState names one of them.
    pub(crate) peers: Peers,
    /// Tokens whose lost call already ran again here (each at most once).
    pub(crate) replays: SpentTokens,
    /// Approval tokens taken here (each at most once).
    pub(crate) approvals: SpentTokens,
    /// Where the proxy may ask a relayed legacy session inline (it declared elicitation), and
    /// the questions it asked there, pending (the approval gate). Not `bridge`: the sessions the
    /// proxy owns for legacy clients.
    pub(crate) inline_asks: InlineAsks,
    /// Who each request speaks for (`[auth]`).
    pub(crate) auth: Authenticator,
    /// Legacy clients' own upstream sessions, in front of a stdio or HTTP+SSE upstream.
    pub(crate) bridge: Bridge,
}

// What every call actor shares.
fn call_context(
    config: &Config,
    pool: &Arc<SessionPool>,
    tokens: &Arc<TokenCodec>,
    metrics: &Arc<Metrics>,
    shutdown: &watch::Sender<bool>,
) -> Result<Arc<CallContext>, StartError> {
    let tasks = Tasks::new(
        config.tasks.clone(),
        Arc::clone(tokens),
        Arc::clone(metrics),
    )
    .map_err(StartError::TaskStore)?;
    Ok(Arc::new(CallContext {
        pool: Arc::clone(pool),
        parked: ParkedCalls::new(config.state.parked, config.state.ttl),
        tokens: Arc::clone(tokens),
        metrics: Arc::clone(metrics),
        shutdown: shutdown.subscribe(),
        actors: TaskTracker::new(),
        tasks,
        gather: Gather::new(config.state.gather),
        sse_idle_timeout: config.upstream.sse_idle_timeout,
        max_input_requests: config.state.max_input_requests,
        results: config.results,
        replay: config.replay.clone(),
        tool_hints: Default::default(),
    }))
}

// The configured key set, or a generated signing key when none is configured.
fn signing_keys(config: &Config) -> Result<KeySet, KeyError> {
    match keys::load(&config.state.keys)? {
        Some(keys) => Ok(keys),
        // Records in a shared store are sealed: every replica must hold the key.
        None if matches!(config.tasks.store, crate::config::Store::Redis(_)) => {
            Err(KeyError::Invalid {
                what: "tasks.store".into(),
                reason: "a shared task store needs the state key every replica shares: set \
                         [state] secret or secret_file"
                    .into(),
            })
        }
        None => {
            tracing::info!("no state key configured: generated a random signing key (single instance only; tokens die with the process)");
            KeySet::generated()
        }
    }
}

/// Why the proxy cannot start with a configuration whose syntax is valid.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A state key cannot be read or used.
    #[error(transparent)]
    Keys(#[from] KeyError),
    /// An `[auth]` key set or client secret cannot be read.
    #[error(transparent)]
    Auth(#[from] AuthSetupError),
    /// The task store cannot be set up (its password or a TLS file cannot be read); the
    /// message names the key.
    #[error("{0}")]
    TaskStore(String),
}

impl App {
    /// Sends a retry or a `tasks/*` request to instance `owner` (see [`Peers::forward`]): a
    /// peer of the configured set, or the address `owner` announced in a shared task store.
    ///
    /// # Errors
    /// Why the owner cannot be reached.
    pub(crate) async fn forward(
        &self,
        owner: &str,
        inbound: crate::cluster::Inbound<'_>,
        kind: crate::ops::metrics::ForwardKind,
    ) -> Result<http::Response<crate::body::Body>, crate::ops::metrics::Forward> {
        let announced = async {
            let addresses = self.calls.tasks.addresses()?;
            addresses.of(owner).await
        };
        self.peers.forward((owner, announced), inbound, kind).await
    }

    /// What [`App::new`] reads and checks before it starts anything, for `check-config`: the
    /// state key set (and that a shared task store has one), the `[auth]` key set and client
    /// secret, the task store's password and TLS files. Nothing is started, nothing is
    /// connected to.
    ///
    /// # Errors
    /// [`StartError`], as `App::new` would fail.
    pub fn check(config: &Config) -> Result<(), StartError> {
        signing_keys(config)?;
        Authenticator::new(
            &config.auth,
            config.upstream.principal_header.clone(),
            Arc::default(),
        )?;
        if let crate::config::Store::Redis(store) = &config.tasks.store {
            // Its password and TLS files: the client is made as at start-up, and not connected.
            let password = crate::tasks::read_password(store).map_err(StartError::TaskStore)?;
            crate::tasks::store_client(store, password).map_err(StartError::TaskStore)?;
        }
        Ok(())
    }

    /// Builds the state from a config: reads the key files, or generates a signing key when
    /// none is configured.
    ///
    /// # Errors
    /// [`StartError`] when a configured key, key set or secret cannot be read or used.
    pub fn new(mut config: Config) -> Result<Arc<Self>, StartError> {
        // The transport may have changed since the file was read (a command line's `--`).
        config.share_sessions();
        let keys = signing_keys(&config)?;
        let (listen_anonymous, legacy_anonymous) = config.anonymous_session_bounds();
        let each = config.pool.max_listen_sessions_per_principal;
        let listen = PrincipalBound::new(each, listen_anonymous);
        let metrics = Arc::new(Metrics::default());
        metrics.parked_bounds(config.parked_limit(), config.state.parked.bytes);
        let pool = SessionPool::new(
            &config.upstream,
            config.pool.clone(),
            listen,
            Arc::clone(&metrics),
        );
        let issuer = fix_instance_id(&mut config.state);
        let auth = Authenticator::new(
            &config.auth,
            config.upstream.principal_header.clone(),
            Arc::clone(&metrics),
        )?;
        let shutdown = watch::channel(false).0;
        let draining = watch::channel(false).0;
        let tokens = Arc::new(TokenCodec::new(keys, issuer, config.state.ttl));
        let calls = call_context(&config, &pool, &tokens, &metrics, &shutdown)?;
        Ok(Arc::new(Self {
            principals: PrincipalGate::new(config.server.limits.max_requests_per_principal),
            peers: Peers::new(
                config.cluster.clone(),
                &config.server.mcp_path,
                Arc::clone(&tokens),
                Arc::clone(&metrics),
            ),
            replays: SpentTokens::new(config.state.ttl),
            approvals: SpentTokens::new(config.state.ttl),
            inline_asks: InlineAsks::new(config.pool.idle_timeout),
            bridge: Bridge::new(
                config.server.legacy_session_idle,
                PrincipalBound::new(
                    config.server.max_legacy_sessions_per_principal,
                    legacy_anonymous,
                ),
            ),
            tokens,
            auth,
            config,
            pool,
            calls,
            metrics,
            draining,
            shutdown,
        }))
    }

    /// Reads the configured key files again (on SIGHUP) and makes them the key set; keys that
    /// drop out keep verifying for one `state.ttl`, and parked calls are untouched. Returns the
    /// new active key's id. With no key configured (a generated one) there is nothing to read
    /// and the key stays.
    ///
    /// # Errors
    /// [`KeyError`] when a file cannot be read or used; the current keys then stay.
    pub fn reload_keys(&self) -> Result<String, KeyError> {
        let outcome = keys::load(&self.config.state.keys);
        self.metrics.key_reload(outcome.is_ok());
        match outcome? {
            Some(keys) => self.tokens.replace_keys(keys),
            None => tracing::info!("no state key configured: the generated key stays"),
        }
        Ok(self.tokens.keys().signing_kid().to_owned())
    }

    /// This instance's id (the owner every token it issues names).
    pub fn instance_id(&self) -> &str {
        self.tokens.issuer()
    }

    /// A peer signature from this instance for instance `aud` over `body` (what a forward
    /// carries); for tests of the peer checks.
    #[doc(hidden)]
    pub fn peer_signature(&self, aud: &str, body: &[u8]) -> Option<String> {
        let v = self.peers.sign(aud, body)?;
        v.to_str().ok().map(str::to_owned)
    }

    /// Ids of the keys that verify a token right now, the active one first.
    pub fn key_ids(&self) -> Vec<String> {
        self.tokens.keys().kids()
    }

    /// Starts the drain (see `server`): readiness goes off and no new call or listen stream is
    /// taken.
    pub(crate) fn begin_drain(&self) {
        self.draining.send_replace(true);
        self.calls.actors.close();
    }

    /// Whether the drain has begun.
    pub(crate) fn is_draining(&self) -> bool {
        *self.draining.borrow()
    }

    /// Ends the drain: every open call cancels upstream and answers its client 503.
    pub(crate) fn cancel_all(&self) {
        self.shutdown.send_replace(true);
    }

    /// Calls parked right now.
    pub fn parked_calls(&self) -> usize {
        self.calls.parked.len()
    }

    /// Call actors running now (parked ones included).
    pub fn open_calls(&self) -> usize {
        self.calls.open()
    }

    /// Bytes charged to parked calls right now (against `state.max_parked_memory`).
    pub fn parked_memory(&self) -> usize {
        self.calls.parked.held_bytes()
    }

    /// Principals with a request in flight right now.
    pub fn busy_principals(&self) -> usize {
        self.principals.principals()
    }

    /// Idle upstream sessions right now.
    pub fn idle_sessions(&self) -> usize {
        self.pool.idle_count()
    }

    /// Upstream sessions leased right now (open and not idle: held by a call or a stream).
    pub fn leased_sessions(&self) -> usize {
        self.pool
            .open_sessions()
            .saturating_sub(self.pool.idle_count())
    }

    /// Upstream sessions `subscriptions/listen` streams pin right now (streams of one principal
    /// and capabilities share one).
    pub fn listen_sessions(&self) -> usize {
        self.pool.pinned_sessions()
    }

    /// Requests waiting for an upstream session (the pool is full).
    pub fn session_waiters(&self) -> usize {
        self.pool.waiters()
    }

    /// Closes idle sessions past `pool.idle_timeout` now (the background task does it
    /// periodically); returns how many.
    pub async fn reap_idle_sessions(&self) -> usize {
        self.pool.reap_idle().await
    }

    /// What the upstream is, for logs: its URL, or a stdio server's program.
    pub fn upstream_name(&self) -> String {
        self.config.upstream.name()
    }

    /// Warns about each `[approval.tools]` entry that matches none of the upstream's tools (a
    /// misspelt name would leave its tool ungated). Best effort, once the upstream is up: its
    /// `tools/list` as an anonymous principal with no capabilities sees it.
    pub(crate) async fn check_approval_policy(&self) {
        let approval = &self.config.approval;
        if !approval.is_enabled() {
            return;
        }
        let anonymous = principal_digest(None);
        let lease = match self
            .pool
            .lease(&anonymous, &Declared::nothing(), &Credentials::default())
            .await
        {
            Ok(lease) => lease,
            Err(e) => {
                tracing::debug!(error = %e, "cannot list the upstream's tools to check [approval]");
                return;
            }
        };
        let listing = lease
            .session()
            .list_all("tools/list", "tools", POLICY_CHECK_PAGES);
        let Ok(tools) = tokio::time::timeout(POLICY_CHECK_TIMEOUT, listing).await else {
            return;
        };
        let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
        for rule in &approval.rules {
            if !names.iter().any(|n| rule.matches(n)) {
                tracing::warn!(policy = %rule.pattern, "an [approval.tools] entry matches no tool the upstream lists: check its spelling");
            }
        }
    }

    /// Runs one upstream handshake to learn whether the upstream is up (and sets readiness).
    pub async fn probe_upstream(&self) -> bool {
        self.pool.probe().await
    }
}
