//! `[upstream]`: where the legacy server is, how it is reached (`transport` beneath it), how
//! long it may take, and what the proxy tells it on the principal's behalf.

use std::collections::BTreeMap;
use std::time::Duration;

use http::{HeaderName, Uri};
use serde::Deserialize;

use super::error::{invalid, ConfigError};
use super::transport::{self, RawTransport, UpstreamTransport};
use super::units::{nonzero_duration, size};

/// Default upstream.
pub const DEFAULT_UPSTREAM: &str = "http://127.0.0.1:3000/mcp";

/// `[upstream]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawUpstream {
    /// `url`
    pub url: Option<String>,
    /// `protocol_version`
    pub protocol_version: Option<String>,
    /// `timeout`
    pub timeout: Option<String>,
    /// `sse_idle_timeout`
    pub sse_idle_timeout: Option<String>,
    /// `health_interval`
    pub health_interval: Option<String>,
    /// `max_idle_connections`
    pub max_idle_connections: Option<usize>,
    /// `max_sse_event`
    pub max_sse_event: Option<String>,
    /// `principal_header`
    pub principal_header: Option<String>,
    /// `default_roots`
    pub default_roots: Vec<toml::Value>,
    /// `transport`
    pub transport: Option<String>,
    /// `command`
    pub command: Option<Vec<String>>,
    /// `env`
    pub env: BTreeMap<String, String>,
    /// `cwd`
    pub cwd: Option<String>,
    /// `max_processes`
    pub max_processes: Option<usize>,
}

/// `[upstream]`, validated.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// The legacy upstream's MCP endpoint (the SSE URL of an HTTP+SSE server; unused for stdio).
    pub url: Uri,
    /// How the upstream is reached: Streamable HTTP, HTTP+SSE, either (detected), or stdio.
    pub transport: UpstreamTransport,
    /// Protocol version the proxy asks for in `initialize`.
    pub protocol_version: String,
    /// Timeout for connecting to and getting response headers from the upstream.
    pub timeout: Duration,
    /// How often readiness checks that the upstream still accepts connections.
    pub health_interval: Duration,
    /// A running call whose upstream response sends nothing at all for this long fails (504).
    pub sse_idle_timeout: Duration,
    /// Idle connections to the upstream kept for reuse (more are closed).
    pub max_idle_connections: usize,
    /// Largest accepted SSE event from the upstream.
    pub max_sse_event_bytes: usize,
    /// Request header that identifies the principal (lowercase); forwarded upstream unchanged.
    pub principal_header: HeaderName,
    /// Roots given to an upstream `roots/list` that belongs to no client call.
    pub default_roots: Vec<serde_json::Value>,
}

impl Upstream {
    pub(super) fn from_raw(u: RawUpstream) -> Result<Self, ConfigError> {
        Ok(Self {
            url: parse_upstream(u.url.as_deref().unwrap_or(DEFAULT_UPSTREAM))?,
            transport: transport::from_raw(&RawTransport {
                transport: u.transport.as_deref(),
                command: u.command.as_ref(),
                env: &u.env,
                cwd: u.cwd.as_deref(),
                max_processes: u.max_processes,
            })?,
            protocol_version: u
                .protocol_version
                .unwrap_or_else(|| crate::protocol::DEFAULT_LEGACY_VERSION.to_owned()),
            timeout: nonzero_duration("upstream.timeout", u.timeout.as_deref(), "60s")?,
            sse_idle_timeout: nonzero_duration(
                "upstream.sse_idle_timeout",
                u.sse_idle_timeout.as_deref(),
                "10m",
            )?,
            health_interval: nonzero_duration(
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

    /// What the upstream is, for logs: its URL, or a stdio server's program.
    pub fn name(&self) -> String {
        match &self.transport {
            UpstreamTransport::Stdio(cmd) => format!("stdio:{}", cmd.program),
            _ => self.url.to_string(),
        }
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

fn principal_header(raw: Option<&str>) -> Result<HeaderName, ConfigError> {
    let name = raw.unwrap_or("authorization").to_ascii_lowercase();
    let name = HeaderName::from_bytes(name.as_bytes())
        .map_err(|e| invalid("upstream.principal_header", e))?;
    // A hop-by-hop header ends at the proxy: no upstream request or peer forward carries it.
    if crate::protocol::HOP_BY_HOP.contains(&name) {
        return Err(invalid(
            "upstream.principal_header",
            format!(
                "`{name}` is a hop-by-hop header: it is not passed on to the upstream or a peer"
            ),
        ));
    }
    Ok(name)
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
