//! `[server]`: the client-facing listener, its path and origins, and every bound on what one
//! client may send or hold open.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use super::error::{invalid, positive, ConfigError};
use super::units::{duration, nonzero_duration, size};

/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Smallest `server.max_header_bytes` (hyper reads heads into a buffer of at least this).
pub const MIN_HEADER_BYTES: usize = 8192;

/// `[server]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawServer {
    /// `listen`
    pub listen: Option<String>,
    /// `mcp_path`
    pub mcp_path: Option<String>,
    /// `allowed_origins`
    pub allowed_origins: Vec<String>,
    /// `max_body`
    pub max_body: Option<String>,
    /// `keepalive`
    pub keepalive: Option<String>,
    /// `max_connections`
    pub max_connections: Option<usize>,
    /// `max_headers`
    pub max_headers: Option<usize>,
    /// `max_header_bytes`
    pub max_header_bytes: Option<String>,
    /// `max_requests_per_principal`
    pub max_requests_per_principal: Option<usize>,
    /// `header_read_timeout`
    pub header_read_timeout: Option<String>,
    /// `body_read_timeout`
    pub body_read_timeout: Option<String>,
    /// `shutdown_grace`
    pub shutdown_grace: Option<String>,
    /// `shutdown_cancel_timeout`
    pub shutdown_cancel_timeout: Option<String>,
    /// `legacy_session_idle`
    pub legacy_session_idle: Option<String>,
    /// `sse_path`
    pub sse_path: Option<String>,
    /// `sse_messages_path`
    pub sse_messages_path: Option<String>,
    /// `max_legacy_sessions_per_principal`
    pub max_legacy_sessions_per_principal: Option<usize>,
}

/// `[server]`, validated.
#[derive(Debug, Clone)]
pub struct Server {
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
    /// Bounds on what one client may send or hold open.
    pub limits: ClientLimits,
    /// A legacy client's own upstream session (in front of a stdio or HTTP+SSE upstream) ends
    /// after this long without a request or an open stream.
    pub legacy_session_idle: Duration,
    /// Such sessions one principal may hold at once (unset: a share of the pool, see `sizing`).
    pub max_legacy_sessions_per_principal: usize,
    /// Where a 2024-11-05 HTTP+SSE client opens its stream (`GET`).
    pub sse_path: String,
    /// Where it POSTs its messages (`?sessionId=`, announced by the `endpoint` event).
    pub sse_messages_path: String,
}

/// Bounds on one client's requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientLimits {
    /// Header fields in one request; more get 431.
    pub max_headers: usize,
    /// Bytes of one request's head (request line and headers); more get 431.
    pub max_header_bytes: usize,
    /// Requests of one principal answered at once; more get 429.
    pub max_requests_per_principal: usize,
}

impl Server {
    pub(super) fn from_raw(s: RawServer) -> Result<Self, ConfigError> {
        let listen = s.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
        let server = Self {
            listen: listen.parse().map_err(|e| invalid("server.listen", e))?,
            mcp_path: path("server.mcp_path", s.mcp_path.as_deref(), "/mcp")?,
            sse_path: path("server.sse_path", s.sse_path.as_deref(), "/sse")?,
            sse_messages_path: path(
                "server.sse_messages_path",
                s.sse_messages_path.as_deref(),
                "/messages",
            )?,
            max_body_bytes: size("server.max_body", s.max_body.as_deref(), "4MiB")?,
            keepalive: nonzero_duration("server.keepalive", s.keepalive.as_deref(), "15s")?,
            max_connections: positive("server.max_connections", s.max_connections, 1024)?,
            header_read_timeout: nonzero_duration(
                "server.header_read_timeout",
                s.header_read_timeout.as_deref(),
                "30s",
            )?,
            body_read_timeout: nonzero_duration(
                "server.body_read_timeout",
                s.body_read_timeout.as_deref(),
                "30s",
            )?,
            shutdown_grace: duration("server.shutdown_grace", s.shutdown_grace.as_deref(), "10s")?,
            shutdown_cancel_timeout: nonzero_duration(
                "server.shutdown_cancel_timeout",
                s.shutdown_cancel_timeout.as_deref(),
                "5s",
            )?,
            limits: ClientLimits::from_raw(&s)?,
            legacy_session_idle: nonzero_duration(
                "server.legacy_session_idle",
                s.legacy_session_idle.as_deref(),
                "10m",
            )?,
            // Unset: a share of the pool, once its size is known (`sizing::shares`).
            max_legacy_sessions_per_principal: positive(
                "server.max_legacy_sessions_per_principal",
                s.max_legacy_sessions_per_principal,
                1,
            )?,
            allowed_origins: s.allowed_origins,
        };
        let paths = [
            &server.mcp_path,
            &server.sse_path,
            &server.sse_messages_path,
        ];
        if paths[0] == paths[1] || paths[0] == paths[2] || paths[1] == paths[2] {
            return Err(invalid(
                "server.sse_path",
                "mcp_path, sse_path and sse_messages_path must differ",
            ));
        }
        Ok(server)
    }
}

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

fn path(key: &'static str, raw: Option<&str>, default: &str) -> Result<String, ConfigError> {
    let path = raw.unwrap_or(default);
    if !path.starts_with('/') || path.contains(['?', '#']) {
        return Err(invalid(key, "must be a path starting with '/'"));
    }
    Ok(path.to_owned())
}
