//! The configuration file as written: every table and key, optional, unknown keys rejected.
//! Values stay strings here; `Config::from_raw` parses and validates them, naming the key.

use serde::Deserialize;

/// The file as written. Every key is optional and has a documented default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawConfig {
    /// `[server]`
    pub server: RawServer,
    /// `[upstream]`
    pub upstream: RawUpstream,
    /// `[pool]`
    pub pool: RawPool,
    /// `[state]`
    pub state: RawState,
    /// `[results]`
    pub results: RawResults,
    /// `[admin]`
    pub admin: RawAdmin,
    /// `[log]`
    pub log: RawLog,
    /// `[cluster]`
    pub cluster: RawCluster,
    /// `[replay]`
    pub replay: RawReplay,
}

/// `[replay]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawReplay {
    /// `default`
    pub default: Option<String>,
    /// `prompts`
    pub prompts: Option<String>,
    /// `resources`
    pub resources: Option<String>,
    /// `max_state`
    pub max_state: Option<String>,
    /// `[replay.tools]`
    pub tools: std::collections::BTreeMap<String, String>,
}

/// `[cluster]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawCluster {
    /// `peers`
    pub peers: Vec<String>,
    /// `peers_dns`
    pub peers_dns: Option<String>,
    /// `refresh_interval`
    pub refresh_interval: Option<String>,
    /// `forward_timeout`
    pub forward_timeout: Option<String>,
}

/// `[admin]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawAdmin {
    /// `listen`
    pub listen: Option<String>,
}

/// `[log]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLog {
    /// `format`
    pub format: Option<String>,
    /// `level`
    pub level: Option<String>,
}

/// `[server]` table.
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
}

/// `[upstream]` table.
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
    pub env: std::collections::BTreeMap<String, String>,
    /// `cwd`
    pub cwd: Option<String>,
    /// `max_processes`
    pub max_processes: Option<usize>,
}

/// `[pool]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawPool {
    /// `max_sessions`
    pub max_sessions: Option<usize>,
    /// `idle_timeout`
    pub idle_timeout: Option<String>,
    /// `acquire_timeout`
    pub acquire_timeout: Option<String>,
}

/// `[state]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawState {
    /// `ttl`
    pub ttl: Option<String>,
    /// `secret`
    pub secret: Option<String>,
    /// `secret_file`
    pub secret_file: Option<String>,
    /// `verify_secret_files`
    pub verify_secret_files: Vec<String>,
    /// `instance_id`
    pub instance_id: Option<String>,
    /// `gather_window`
    pub gather_window: Option<String>,
    /// `gather`
    pub gather: Option<String>,
    /// `gather_max_targets`
    pub gather_max_targets: Option<usize>,
    /// `max_parked`
    pub max_parked: Option<usize>,
    /// `max_parked_per_principal`
    pub max_parked_per_principal: Option<usize>,
    /// `max_parked_memory`
    pub max_parked_memory: Option<String>,
    /// `max_input_requests`
    pub max_input_requests: Option<usize>,
}

/// `[results]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawResults {
    /// `ttl_ms`
    pub ttl_ms: Option<u64>,
    /// `cache_scope`
    pub cache_scope: Option<String>,
}
