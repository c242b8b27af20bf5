//! Configuration: TOML text → validated, typed [`Config`].
//!
//! [`RawConfig`] mirrors the file (unknown keys rejected); [`Config::from_toml_str`] turns it into
//! typed values and names the bad key on failure. Only `main.rs` reads files or the environment.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::Uri;

mod error;
mod gather;
mod raw;
mod transport;
mod units;

pub use error::ConfigError;
use error::{invalid, positive};
pub use gather::{GatherMode, Gathering};

pub use raw::{
    RawAdmin, RawCluster, RawConfig, RawLog, RawPool, RawReplay, RawResults, RawServer, RawState,
    RawUpstream,
};
pub use transport::{StdioCommand, UpstreamTransport, DEFAULT_MAX_PROCESSES};
pub use units::{parse_duration, parse_size};

/// Where the keys come from (the `[state]` keys of the config).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeySources {
    /// `state.secret`: an HS256 secret in the TOML itself.
    pub secret: Option<Secret>,
    /// `state.secret_file`: the active key's file.
    pub secret_file: Option<PathBuf>,
    /// `state.verify_secret_files`: keys accepted for verification only.
    pub verify_files: Vec<PathBuf>,
}

/// A secret whose `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(s: String) -> Self {
        Self(s)
    }
    /// The secret bytes; never log them.
    pub fn expose(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// `cacheScope` stamped on cacheable results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheScope {
    /// May be shared across users.
    Public,
    /// Per authorization context (the safe default).
    Private,
}

impl CacheScope {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Public => "public",
            Self::Private => "private",
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (coloured on a terminal).
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address the proxy listens on.
    pub listen: SocketAddr,
    /// Path of the MCP endpoint (both eras), e.g. `/mcp`.
    pub mcp_path: String,
    /// Extra allowed `Origin` values (loopback origins are always allowed; `*` allows any).
    pub allowed_origins: Vec<String>,
    /// Largest accepted client request body.
    pub max_body_bytes: usize,
    /// Interval of SSE keep-alive comments; also how long a response waits before it turns into SSE.
    pub keepalive: Duration,
    /// Bound on simultaneous client connections.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers (and to send anything at all on a
    /// new or idle keep-alive connection) before the connection is closed.
    pub header_read_timeout: Duration,
    /// How long a client may take to send a request's body before it gets 408.
    pub body_read_timeout: Duration,
    /// On shutdown, how long in-flight and parked calls get to finish or be resumed.
    pub shutdown_grace: Duration,
    /// After the grace, how long calls still open get to cancel upstream (acknowledged) and
    /// sessions to be DELETEd.
    pub shutdown_cancel_timeout: Duration,
    /// Separate address for `/healthz`, `/readyz`, `/metrics`; `None` serves them on `listen`.
    pub admin_listen: Option<SocketAddr>,
    /// Log line format.
    pub log_format: LogFormat,
    /// Log filter (`tracing` directives, e.g. `info` or `mrtr_proxy=debug`); `RUST_LOG` wins.
    pub log_level: String,
    /// The legacy upstream's MCP endpoint (the SSE URL of an HTTP+SSE server; unused for stdio).
    pub upstream: Uri,
    /// How the upstream is reached: Streamable HTTP, HTTP+SSE, either (detected), or stdio.
    pub upstream_transport: UpstreamTransport,
    /// Protocol version the proxy asks for in `initialize`.
    pub upstream_protocol_version: String,
    /// Timeout for connecting to and getting response headers from the upstream.
    pub upstream_timeout: Duration,
    /// How often readiness checks that the upstream still accepts connections.
    pub upstream_health_interval: Duration,
    /// A running call whose upstream response sends nothing at all for this long fails (504).
    pub upstream_sse_idle_timeout: Duration,
    /// Idle connections to the upstream kept for reuse (more are closed).
    pub upstream_max_idle_connections: usize,
    /// Largest accepted SSE event from the upstream.
    pub max_sse_event_bytes: usize,
    /// Request header that identifies the principal (lowercase); forwarded upstream unchanged.
    pub principal_header: http::HeaderName,
    /// Roots given to an upstream `roots/list` that belongs to no client call.
    pub default_roots: Vec<serde_json::Value>,
    /// Upper bound on upstream sessions across all principals.
    pub max_sessions: usize,
    /// Idle sessions are closed (DELETE) after this long.
    pub session_idle: Duration,
    /// How long a request waits for a session when the pool is full.
    pub session_acquire_timeout: Duration,
    /// Lifetime of a requestState token and of the parked call behind it.
    pub state_ttl: Duration,
    /// Where the requestState keys come from (read by `keys::load` at start-up and on SIGHUP);
    /// none at all means a random key generated at start-up.
    pub state_keys: KeySources,
    /// Issuer id of this instance, put in every token.
    pub instance_id: Option<String>,
    /// How server requests arriving together are gathered into one round.
    pub gather: Gathering,
    /// Bound on parked calls across all principals.
    pub max_parked: usize,
    /// Bound on parked calls per principal.
    pub max_parked_per_principal: usize,
    /// Bound on the memory charged to parked calls in all (params + a fixed overhead each).
    pub max_parked_memory: usize,
    /// Bounds on what one client may send or hold open.
    pub client_limits: ClientLimits,
    /// Server requests one call may have pending at once (a round is at most this many keys).
    pub max_input_requests: usize,
    /// `ttlMs` stamped on cacheable results.
    pub cache_ttl_ms: u64,
    /// `cacheScope` stamped on cacheable results.
    pub cache_scope: CacheScope,
    /// The other replicas a retry may be forwarded to (`[cluster]`).
    pub cluster: Cluster,
    /// Which calls may run again on another replica when their owner is gone (`[replay]`).
    pub replay: Replay,
}

/// Whether a call may be run again, from its token, when the instance that held it is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayMode {
    /// Always replay-safe.
    Always,
    /// Never: a lost call gets the "call lost" error.
    Never,
    /// As the upstream's own `tools/list` annotations say: `readOnlyHint` or
    /// `idempotentHint` true.
    Annotations,
}

/// `[replay]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// Tools not named in `tools`.
    pub default: ReplayMode,
    /// Per-tool overrides.
    pub tools: std::collections::BTreeMap<String, ReplayMode>,
    /// `prompts/get`.
    pub prompts: ReplayMode,
    /// `resources/read`.
    pub resources: ReplayMode,
    /// Largest journal (answers so far, as JSON) a token carries; a call whose answers grow
    /// past it is no longer replayable.
    pub max_state: usize,
}

impl Replay {
    fn from_raw(r: RawReplay) -> Result<Self, ConfigError> {
        let mode =
            |key: &'static str, v: Option<&str>, default: ReplayMode, annotations: bool| match v {
                None => Ok(default),
                Some("always") => Ok(ReplayMode::Always),
                Some("never") => Ok(ReplayMode::Never),
                Some("annotations") if annotations => Ok(ReplayMode::Annotations),
                Some(_) if annotations => Err(invalid(
                    key,
                    "want \"annotations\", \"always\" or \"never\"",
                )),
                Some(_) => Err(invalid(key, "want \"always\" or \"never\"")),
            };
        let tools = r
            .tools
            .iter()
            .map(|(k, v)| {
                Ok((
                    k.clone(),
                    mode("replay.tools", Some(v), ReplayMode::Never, true)?,
                ))
            })
            .collect::<Result<_, ConfigError>>()?;
        let max_state = size("replay.max_state", r.max_state.as_deref(), "8KiB")?;
        if max_state > MAX_REPLAY_STATE_BYTES {
            return Err(invalid(
                "replay.max_state",
                "at most 10KiB (the token travels on every retry)",
            ));
        }
        Ok(Self {
            default: mode(
                "replay.default",
                r.default.as_deref(),
                ReplayMode::Annotations,
                true,
            )?,
            tools,
            prompts: mode(
                "replay.prompts",
                r.prompts.as_deref(),
                ReplayMode::Always,
                false,
            )?,
            resources: mode(
                "replay.resources",
                r.resources.as_deref(),
                ReplayMode::Always,
                false,
            )?,
            max_state,
        })
    }

    /// The mode of `method` on `target` (a tool name for `tools/call`).
    pub fn mode(&self, method: &str, target: &str) -> ReplayMode {
        match method {
            "tools/call" => self.tools.get(target).copied().unwrap_or(self.default),
            "prompts/get" => self.prompts,
            "resources/read" => self.resources,
            _ => ReplayMode::Never,
        }
    }
}

/// `[cluster]`, validated: where the peers are and how long to wait for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// Static peers: the MCP endpoint URL of each (`http://10.0.0.5:8080/mcp`).
    pub peers: Vec<Uri>,
    /// A DNS name and port whose addresses are the peers (a headless Service), resolved again
    /// at most once per `refresh_interval`; each address is reached at `mcp_path`.
    pub peers_dns: Option<(String, u16)>,
    /// How long a learnt peer identity (instance id → URL) is trusted before it is asked again.
    pub refresh_interval: Duration,
    /// How long a forward may take to connect and get response headers from the owner.
    pub forward_timeout: Duration,
}

impl Cluster {
    fn from_raw(c: RawCluster) -> Result<Self, ConfigError> {
        let peers = c
            .peers
            .iter()
            .map(|p| parse_upstream(p).map_err(|_| invalid("cluster.peers", "not an http URL")))
            .collect::<Result<Vec<_>, _>>()?;
        let peers_dns = match c.peers_dns {
            None => None,
            Some(s) => {
                let (host, port) = s
                    .rsplit_once(':')
                    .ok_or_else(|| invalid("cluster.peers_dns", "want \"name:port\""))?;
                let port = port
                    .parse::<u16>()
                    .map_err(|_| invalid("cluster.peers_dns", "the port is not a number"))?;
                if host.is_empty() {
                    return Err(invalid("cluster.peers_dns", "the name is empty"));
                }
                Some((host.to_owned(), port))
            }
        };
        Ok(Self {
            peers,
            peers_dns,
            refresh_interval: nonzero_dur(
                "cluster.refresh_interval",
                c.refresh_interval.as_deref(),
                "10s",
            )?,
            forward_timeout: nonzero_dur(
                "cluster.forward_timeout",
                c.forward_timeout.as_deref(),
                "5s",
            )?,
        })
    }

    /// Whether any peer is configured (else a retry for another instance is never forwarded).
    pub fn is_enabled(&self) -> bool {
        !self.peers.is_empty() || self.peers_dns.is_some()
    }
}

/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default upstream.
pub const DEFAULT_UPSTREAM: &str = "http://127.0.0.1:3000/mcp";
/// Largest `replay.max_state`: a token carries the journal on every retry.
pub const MAX_REPLAY_STATE_BYTES: usize = 10 * 1024;
/// Smallest secret accepted for HS256.
pub const MIN_SECRET_BYTES: usize = 32;

impl Config {
    /// Parses and validates TOML text.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad key.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig = toml::from_str(text)?;
        Self::from_raw(raw)
    }

    /// Validates a [`RawConfig`].
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first bad key.
    pub fn from_raw(raw: RawConfig) -> Result<Self, ConfigError> {
        let s = raw.server;
        let p = raw.pool;
        let st = raw.state;
        let r = raw.results;
        let listen = s.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
        let listen: SocketAddr = listen.parse().map_err(|e| invalid("server.listen", e))?;
        let times = ServerTimes::from_raw(&s)?;
        let client_limits = ClientLimits::from_raw(&s)?;
        let mcp_path = mcp_path(s.mcp_path)?;
        let up = UpstreamSettings::from_raw(raw.upstream)?;
        let pool = Bounds::from_raw(p, &st)?;
        let gather = Gathering::from_raw(&st)?;
        let state_keys = key_sources(st.secret, st.secret_file, st.verify_secret_files)?;
        let cache_scope = cache_scope(r.cache_scope.as_deref())?;
        let state_ttl = nonzero_dur("state.ttl", st.ttl.as_deref(), "5m")?;
        let admin_listen = admin_listen(raw.admin.listen.as_deref())?;
        let (log_format, log_level) = log(raw.log)?;
        Ok(Self {
            listen,
            mcp_path,
            allowed_origins: s.allowed_origins,
            max_body_bytes: size("server.max_body", s.max_body.as_deref(), "4MiB")?,
            keepalive: times.keepalive,
            max_connections: positive("server.max_connections", s.max_connections, 1024)?,
            header_read_timeout: times.header_read,
            body_read_timeout: times.body_read,
            shutdown_grace: times.shutdown_grace,
            shutdown_cancel_timeout: times.shutdown_cancel,
            admin_listen,
            log_format,
            log_level,
            upstream: up.url,
            upstream_transport: up.transport,
            upstream_protocol_version: up.protocol_version,
            upstream_timeout: up.timeout,
            upstream_health_interval: up.health_interval,
            upstream_sse_idle_timeout: up.sse_idle_timeout,
            upstream_max_idle_connections: up.max_idle_connections,
            max_sse_event_bytes: up.max_sse_event_bytes,
            principal_header: up.principal_header,
            default_roots: up.default_roots,
            max_sessions: pool.max_sessions,
            session_idle: pool.session_idle,
            session_acquire_timeout: pool.session_acquire_timeout,
            state_ttl,
            state_keys,
            instance_id: st.instance_id,
            gather,
            max_parked: pool.max_parked,
            max_parked_per_principal: pool.max_parked_per_principal,
            max_parked_memory: pool.max_parked_memory,
            client_limits,
            max_input_requests: pool.max_input_requests,
            cache_ttl_ms: r.ttl_ms.unwrap_or(0),
            cache_scope,
            cluster: Cluster::from_raw(raw.cluster)?,
            replay: Replay::from_raw(raw.replay)?,
        })
    }

    /// The built-in defaults (what runs with no file).
    ///
    /// # Errors
    /// Never in practice; the defaults are valid.
    pub fn defaults() -> Result<Self, ConfigError> {
        Self::from_raw(RawConfig::default())
    }
}

/// Parses the upstream URL (http only: a sidecar talks to its server over loopback or a pod network).
///
/// # Errors
/// [`ConfigError::Invalid`] for anything but an absolute `http://` URL.
pub fn parse_upstream(url: &str) -> Result<Uri, ConfigError> {
    let uri: Uri = url.parse().map_err(|e| invalid("upstream.url", e))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(invalid("upstream.url", "must be an absolute http:// URL"));
    }
    Ok(uri)
}

fn mcp_path(raw: Option<String>) -> Result<String, ConfigError> {
    let path = raw.unwrap_or_else(|| "/mcp".to_owned());
    if !path.starts_with('/') {
        return Err(invalid("server.mcp_path", "must start with '/'"));
    }
    Ok(path)
}

fn principal_header(raw: Option<&str>) -> Result<http::HeaderName, ConfigError> {
    let name = raw.unwrap_or("authorization").to_ascii_lowercase();
    http::HeaderName::from_bytes(name.as_bytes())
        .map_err(|e| invalid("upstream.principal_header", e))
}

// `[pool]` and the parked-call bounds of `[state]`, validated.
struct Bounds {
    max_sessions: usize,
    session_idle: Duration,
    session_acquire_timeout: Duration,
    max_parked: usize,
    max_parked_per_principal: usize,
    max_parked_memory: usize,
    max_input_requests: usize,
}

impl Bounds {
    fn from_raw(p: RawPool, st: &RawState) -> Result<Self, ConfigError> {
        Ok(Self {
            max_parked: positive("state.max_parked", st.max_parked, 500)?,
            max_input_requests: positive("state.max_input_requests", st.max_input_requests, 32)?,
            max_parked_memory: size(
                "state.max_parked_memory",
                st.max_parked_memory.as_deref(),
                "256MiB",
            )?,
            max_parked_per_principal: positive(
                "state.max_parked_per_principal",
                st.max_parked_per_principal,
                100,
            )?,
            max_sessions: positive("pool.max_sessions", p.max_sessions, 512)?,
            session_idle: nonzero_dur("pool.idle_timeout", p.idle_timeout.as_deref(), "5m")?,
            session_acquire_timeout: dur(
                "pool.acquire_timeout",
                p.acquire_timeout.as_deref(),
                "10s",
            )?,
        })
    }
}

// `[upstream]`, validated.
struct UpstreamSettings {
    url: Uri,
    transport: UpstreamTransport,
    protocol_version: String,
    timeout: Duration,
    sse_idle_timeout: Duration,
    health_interval: Duration,
    max_idle_connections: usize,
    max_sse_event_bytes: usize,
    principal_header: http::HeaderName,
    default_roots: Vec<serde_json::Value>,
}

impl UpstreamSettings {
    fn from_raw(u: RawUpstream) -> Result<Self, ConfigError> {
        Ok(Self {
            url: parse_upstream(u.url.as_deref().unwrap_or(DEFAULT_UPSTREAM))?,
            transport: transport::from_raw(&u)?,
            protocol_version: u
                .protocol_version
                .unwrap_or_else(|| crate::protocol::DEFAULT_LEGACY_VERSION.to_owned()),
            timeout: nonzero_dur("upstream.timeout", u.timeout.as_deref(), "60s")?,
            sse_idle_timeout: nonzero_dur(
                "upstream.sse_idle_timeout",
                u.sse_idle_timeout.as_deref(),
                "10m",
            )?,
            health_interval: nonzero_dur(
                "upstream.health_interval",
                u.health_interval.as_deref(),
                "5s",
            )?,
            max_idle_connections: u.max_idle_connections.unwrap_or(64),
            max_sse_event_bytes: size(
                "upstream.max_sse_event",
                u.max_sse_event.as_deref(),
                "8MiB",
            )?,
            principal_header: principal_header(u.principal_header.as_deref())?,
            default_roots: roots(u.default_roots)?,
        })
    }
}

/// Bounds on one client's requests (`[server]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientLimits {
    /// Header fields in one request; more get 431.
    pub max_headers: usize,
    /// Bytes of one request's head (request line and headers); more get 431.
    pub max_header_bytes: usize,
    /// Requests of one principal answered at once; more get 429.
    pub max_requests_per_principal: usize,
}

/// Smallest `server.max_header_bytes` (hyper reads heads into a buffer of at least this).
pub const MIN_HEADER_BYTES: usize = 8192;

impl ClientLimits {
    fn from_raw(s: &RawServer) -> Result<Self, ConfigError> {
        let max_header_bytes = size(
            "server.max_header_bytes",
            s.max_header_bytes.as_deref(),
            "64KiB",
        )?;
        if max_header_bytes < MIN_HEADER_BYTES {
            return Err(invalid(
                "server.max_header_bytes",
                format!("must be at least {MIN_HEADER_BYTES} bytes (8KiB)"),
            ));
        }
        Ok(Self {
            max_headers: positive("server.max_headers", s.max_headers, 100)?,
            max_header_bytes,
            max_requests_per_principal: positive(
                "server.max_requests_per_principal",
                s.max_requests_per_principal,
                256,
            )?,
        })
    }
}

// The durations of `[server]`, validated.
struct ServerTimes {
    keepalive: Duration,
    header_read: Duration,
    body_read: Duration,
    shutdown_grace: Duration,
    shutdown_cancel: Duration,
}

impl ServerTimes {
    fn from_raw(s: &RawServer) -> Result<Self, ConfigError> {
        Ok(Self {
            keepalive: nonzero_dur("server.keepalive", s.keepalive.as_deref(), "15s")?,
            header_read: nonzero_dur(
                "server.header_read_timeout",
                s.header_read_timeout.as_deref(),
                "30s",
            )?,
            body_read: nonzero_dur(
                "server.body_read_timeout",
                s.body_read_timeout.as_deref(),
                "30s",
            )?,
            shutdown_grace: dur("server.shutdown_grace", s.shutdown_grace.as_deref(), "10s")?,
            shutdown_cancel: nonzero_dur(
                "server.shutdown_cancel_timeout",
                s.shutdown_cancel_timeout.as_deref(),
                "5s",
            )?,
        })
    }
}

fn admin_listen(raw: Option<&str>) -> Result<Option<SocketAddr>, ConfigError> {
    raw.map(|a| a.parse().map_err(|e| invalid("admin.listen", e)))
        .transpose()
}

fn log(raw: RawLog) -> Result<(LogFormat, String), ConfigError> {
    let format = match raw.format.as_deref().unwrap_or("text") {
        "text" => LogFormat::Text,
        "json" => LogFormat::Json,
        other => {
            return Err(invalid(
                "log.format",
                format!("`{other}` is not text or json"),
            ))
        }
    };
    let level = raw.level.unwrap_or_else(|| "info".to_owned());
    tracing_subscriber::EnvFilter::try_new(&level).map_err(|e| invalid("log.level", e))?;
    Ok((format, level))
}

fn roots(raw: Vec<toml::Value>) -> Result<Vec<serde_json::Value>, ConfigError> {
    let roots = raw
        .into_iter()
        .map(|v| serde_json::to_value(v).map_err(|e| invalid("upstream.default_roots", e)))
        .collect::<Result<Vec<_>, _>>()?;
    if roots
        .iter()
        .any(|r| r.get("uri").and_then(|u| u.as_str()).is_none())
    {
        return Err(invalid(
            "upstream.default_roots",
            "every root needs a `uri` string",
        ));
    }
    Ok(roots)
}

fn key_sources(
    raw: Option<String>,
    file: Option<String>,
    verify: Vec<String>,
) -> Result<KeySources, ConfigError> {
    if raw.is_some() && file.is_some() {
        return Err(invalid(
            "state.secret_file",
            "give state.secret or state.secret_file, not both",
        ));
    }
    match raw {
        Some(sec) if sec.len() < MIN_SECRET_BYTES => Err(invalid(
            "state.secret",
            format!("must be at least {MIN_SECRET_BYTES} bytes"),
        )),
        other => Ok(KeySources {
            secret: other.map(Secret::new),
            secret_file: file.map(PathBuf::from),
            verify_files: verify.into_iter().map(PathBuf::from).collect(),
        }),
    }
}

fn cache_scope(raw: Option<&str>) -> Result<CacheScope, ConfigError> {
    match raw.unwrap_or("private") {
        "private" => Ok(CacheScope::Private),
        "public" => Ok(CacheScope::Public),
        other => Err(invalid(
            "results.cache_scope",
            format!("`{other}` is not public or private"),
        )),
    }
}

fn dur(key: &'static str, v: Option<&str>, default: &str) -> Result<Duration, ConfigError> {
    parse_duration(v.unwrap_or(default)).map_err(|e| invalid(key, e))
}

fn nonzero_dur(key: &'static str, v: Option<&str>, default: &str) -> Result<Duration, ConfigError> {
    let d = dur(key, v, default)?;
    if d.is_zero() {
        return Err(invalid(key, "must be greater than zero"));
    }
    Ok(d)
}

fn size(key: &'static str, v: Option<&str>, default: &str) -> Result<usize, ConfigError> {
    match parse_size(v.unwrap_or(default)).map_err(|e| invalid(key, e))? {
        0 => Err(invalid(key, "must be greater than zero")),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_file_parses() {
        let text = include_str!("../config/mrtr-proxy.toml");
        let c = Config::from_toml_str(text).unwrap();
        assert_eq!(c.mcp_path, "/mcp");
        assert_eq!(c.cache_scope, CacheScope::Private);
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = Config::from_toml_str("").unwrap();
        assert_eq!(c.listen, DEFAULT_LISTEN.parse().unwrap());
        assert_eq!(c.state_ttl, Duration::from_secs(300));
        assert_eq!(c.principal_header, "authorization");
    }

    #[test]
    fn valid_fixtures_parse() {
        for (name, text) in fixtures("valid") {
            Config::from_toml_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn invalid_fixtures_name_the_key() {
        let mut seen = 0;
        for (name, text) in fixtures("invalid") {
            // Each invalid fixture's first line is `# key: <the key the error must name>`.
            let key = text
                .lines()
                .next()
                .and_then(|l| l.strip_prefix("# key: "))
                .unwrap()
                .trim()
                .to_owned();
            let err = Config::from_toml_str(&text).expect_err(&name).to_string();
            assert!(
                err.contains(&key),
                "{name}: error `{err}` does not name `{key}`"
            );
            seen += 1;
        }
        assert!(seen >= 5);
    }

    #[test]
    fn secret_debug_is_redacted() {
        let s = Secret::new("super-secret-value".into());
        assert_eq!(format!("{s:?}"), "[redacted]");
    }

    fn fixtures(kind: &str) -> Vec<(String, String)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/config")
            .join(kind);
        let mut out: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let p = e.unwrap().path();
                (
                    p.display().to_string(),
                    std::fs::read_to_string(&p).unwrap(),
                )
            })
            .collect();
        out.sort();
        out
    }
}
