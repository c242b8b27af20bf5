//! Configuration: TOML text → validated, typed [`Config`], shaped like the file: one section
//! type per table, each in `config/<table>.rs` beside its raw form (`Raw*`, unknown keys
//! rejected) and its checks. [`Config::from_toml_str`] names the bad key on failure. Only
//! `main.rs` reads files or the environment.

use serde::Deserialize;

mod admin;
mod approval;
mod auth;
mod cluster;
mod error;
mod gather;
mod log;
mod pool;
mod replay;
mod results;
mod server;
mod sizing;
mod state;
mod store_tls;
mod tasks;
mod telemetry;
mod tools;
mod transport;
mod units;
mod upstream;

pub use admin::{Admin, RawAdmin};
pub use approval::{
    Approval, ApprovalRule, RawApproval, RawToolApproval, MAX_APPROVAL_MESSAGE_BYTES,
};
pub use auth::{
    Auth, Introspection, JwksSource, Jwt, PrincipalSource, RawAuth, RawIntrospection, RawJwt,
    SecretSource,
};
pub use cluster::{Cluster, RawCluster};
pub use error::ConfigError;
pub use gather::{GatherMode, Gathering};
pub use log::{Log, LogFormat, RawLog};
pub use pool::{Pool, RawPool};
pub use replay::{RawReplay, Replay, ReplayMode, MAX_REPLAY_STATE_BYTES};
pub use results::{CacheScope, RawResults, Results};
pub use server::{ClientLimits, RawServer, Server, DEFAULT_LISTEN, MIN_HEADER_BYTES};
pub use sizing::{Sized, PARKED_CALL_BYTES};
pub use state::{HeldBounds, KeySources, RawState, Secret, State, MIN_SECRET_BYTES};
pub use store_tls::{ClientIdentity, StoreTls};
pub use tasks::{RawTasks, RedisStore, Store, TaskMode, Tasks};
pub use telemetry::{RawTelemetry, Telemetry};
pub use tools::ToolTable;
pub use transport::{StdioCommand, UpstreamTransport, DEFAULT_MAX_PROCESSES};
pub use units::{parse_duration, parse_size};
pub use upstream::{parse_upstream, RawUpstream, Upstream, DEFAULT_UPSTREAM};

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
    /// `[approval]`
    pub approval: RawApproval,
    /// `[tasks]`
    pub tasks: RawTasks,
    /// `[auth]`
    pub auth: RawAuth,
    /// `[telemetry]`
    pub telemetry: RawTelemetry,
}

/// The validated configuration: one field per table of the file.
#[derive(Debug, Clone)]
pub struct Config {
    /// `[server]`: the listener and the bounds on clients.
    pub server: Server,
    /// `[upstream]`: the legacy server and how it is reached.
    pub upstream: Upstream,
    /// `[pool]`: upstream sessions.
    pub pool: Pool,
    /// `[state]`: the requestState, rounds and parked calls.
    pub state: State,
    /// `[results]`: cache hints.
    pub results: Results,
    /// `[admin]`: the operator's routes.
    pub admin: Admin,
    /// `[log]`: log format and filter.
    pub log: Log,
    /// `[cluster]`: the other replicas a retry may be forwarded to.
    pub cluster: Cluster,
    /// `[replay]`: which calls may run again on another replica when their owner is gone.
    pub replay: Replay,
    /// `[approval]`: tools a person approves before the upstream sees the call.
    pub approval: Approval,
    /// `[tasks]`: long calls as tasks of the tasks extension.
    pub tasks: Tasks,
    /// `[auth]`: who a request speaks for; OAuth at the edge.
    pub auth: Auth,
    /// `[telemetry]`: OpenTelemetry traces over OTLP.
    pub telemetry: Telemetry,
    /// Which bounds follow from memory and open files (see `sizing`).
    pub sized: Sized,
}

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
        let sized = Sized {
            max_parked: raw.state.max_parked.is_none(),
            max_sessions: raw.pool.max_sessions.is_none(),
            max_listen_sessions_per_principal: raw.pool.max_listen_sessions_per_principal.is_none(),
            max_legacy_sessions_per_principal: raw
                .server
                .max_legacy_sessions_per_principal
                .is_none(),
        };
        let mut config = Self {
            server: Server::from_raw(raw.server)?,
            upstream: Upstream::from_raw(raw.upstream)?,
            pool: Pool::from_raw(raw.pool)?,
            state: State::from_raw(raw.state)?,
            results: Results::from_raw(raw.results)?,
            admin: Admin::from_raw(raw.admin)?,
            log: Log::from_raw(raw.log)?,
            cluster: Cluster::from_raw(raw.cluster)?,
            replay: Replay::from_raw(raw.replay)?,
            approval: Approval::from_raw(raw.approval)?,
            tasks: Tasks::from_raw(raw.tasks)?,
            auth: Auth::from_raw(raw.auth)?,
            telemetry: Telemetry::from_raw(raw.telemetry)?,
            sized,
        };
        sizing::from_memory(config.bounds());
        Ok(config)
    }

    /// Lowers the bounds sized from memory to what `descriptors` open files hold (see
    /// `sizing`); the parked calls they hold, for the start-up log.
    pub fn fit_descriptors(&mut self, descriptors: u64) -> u64 {
        sizing::fit(self.bounds(), descriptors)
    }

    /// Sets the per-principal bounds on upstream sessions the file left unset to a share of
    /// the upstream's sessions as configured now (see `sizing`): after the transport changed
    /// (a command given on the command line), the share follows. `App::new` calls it.
    pub fn share_sessions(&mut self) {
        sizing::shares(self.bounds());
    }

    /// The per-principal bounds on sessions for the principal that names no one (no principal
    /// header, no token: every such client at once), as (listen sessions, legacy sessions): a
    /// bound the file leaves unset is the whole pool for it, up to 16 (a share would leave
    /// capacity unused with every client refused); a bound the file sets holds for it too.
    pub fn anonymous_session_bounds(&self) -> (usize, usize) {
        let all = sizing::everyones_share(self.stdio_processes().unwrap_or(self.pool.max_sessions));
        let listen = match self.sized.max_listen_sessions_per_principal {
            true => all.max(self.pool.max_listen_sessions_per_principal),
            false => self.pool.max_listen_sessions_per_principal,
        };
        let legacy = match self.sized.max_legacy_sessions_per_principal {
            true => all.max(self.server.max_legacy_sessions_per_principal),
            false => self.server.max_legacy_sessions_per_principal,
        };
        (listen, legacy)
    }

    /// The most parked calls the bounds in force let through (`state.max_parked`, what
    /// `state.max_parked_memory` pays for, the upstream sessions: the least). A stdio upstream
    /// has as many sessions as `upstream.max_processes` children.
    pub fn parked_limit(&self) -> usize {
        let limit = sizing::effective(&self.state.parked, &self.pool);
        match &self.upstream.transport {
            UpstreamTransport::Stdio(cmd) => limit.min(cmd.max_processes),
            _ => limit,
        }
    }

    /// Bounds that do not add up, in words, for the start-up log and `check-config` (`room`: the
    /// parked calls the open-file limit holds, as [`Self::fit_descriptors`] said).
    pub fn sizing_warnings(&self, room: u64) -> Vec<String> {
        let mut out = sizing::warnings((&self.state.parked, &self.pool, self.sized), room);
        let legacy = self.server.max_legacy_sessions_per_principal;
        out.extend(sizing::share_warnings(
            (&self.pool, legacy, self.sized),
            self.stdio_processes(),
        ));
        out
    }

    // A stdio upstream's bound on children (its sessions, in place of `pool.max_sessions`).
    fn stdio_processes(&self) -> Option<usize> {
        match &self.upstream.transport {
            UpstreamTransport::Stdio(cmd) => Some(cmd.max_processes),
            _ => None,
        }
    }

    fn bounds(&mut self) -> sizing::Bounds<'_> {
        let stdio_processes = self.stdio_processes();
        sizing::Bounds {
            parked: &mut self.state.parked,
            pool: &mut self.pool,
            max_connections: self.server.max_connections,
            max_tasks: if self.tasks.enabled {
                self.tasks.max
            } else {
                0
            },
            stdio_processes,
            legacy_share: &mut self.server.max_legacy_sessions_per_principal,
            sized: self.sized,
        }
    }

    /// The built-in defaults (what runs with no file).
    ///
    /// # Errors
    /// Never in practice; the defaults are valid.
    pub fn defaults() -> Result<Self, ConfigError> {
        Self::from_raw(RawConfig::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_file_parses() {
        let text = include_str!("../config/mrtr-proxy.toml");
        let c = Config::from_toml_str(text).unwrap();
        assert_eq!(c.server.mcp_path, "/mcp");
        assert_eq!(c.results.scope, CacheScope::Private);
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = Config::from_toml_str("").unwrap();
        assert_eq!(c.server.listen, DEFAULT_LISTEN.parse().unwrap());
        assert_eq!(c.state.ttl, std::time::Duration::from_secs(300));
        assert_eq!(c.upstream.principal_header, "authorization");
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
