//! `[state]`: the requestState (lifetime, keys, this instance's id), how server requests are
//! gathered into rounds (`gather` beside it), and the bounds on parked calls.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::error::{invalid, positive, ConfigError};
use super::gather::Gathering;
use super::units::{nonzero_duration, size};

/// Smallest secret accepted for HS256.
pub const MIN_SECRET_BYTES: usize = 32;

/// `[state]` as written.
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

/// `[state]`, validated.
#[derive(Debug, Clone)]
pub struct State {
    /// Lifetime of a requestState token and of the parked call behind it.
    pub ttl: Duration,
    /// Where the requestState keys come from (read by `keys::load` at start-up and on SIGHUP);
    /// none at all means a random key generated at start-up.
    pub keys: KeySources,
    /// Issuer id of this instance, put in every token.
    pub instance_id: Option<String>,
    /// How server requests arriving together are gathered into one round.
    pub gather: Gathering,
    /// Bounds on parked calls.
    pub parked: HeldBounds,
    /// Server requests one call may have pending at once (a round is at most this many keys).
    pub max_input_requests: usize,
}

/// Bounds on what the proxy holds for clients: parked calls (`state.max_parked*`), tasks
/// (`tasks.max*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldBounds {
    /// Held across all principals.
    pub total: usize,
    /// Held per principal.
    pub per_principal: usize,
    /// Memory charged in all (what each keeps plus a fixed overhead each).
    pub bytes: usize,
}

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

impl State {
    pub(super) fn from_raw(st: RawState) -> Result<Self, ConfigError> {
        Ok(Self {
            ttl: nonzero_duration("state.ttl", st.ttl.as_deref(), "5m")?,
            gather: Gathering::from_raw(
                st.gather.as_deref(),
                st.gather_window.as_deref(),
                st.gather_max_targets,
            )?,
            parked: HeldBounds::from_raw(&st)?,
            max_input_requests: positive("state.max_input_requests", st.max_input_requests, 32)?,
            keys: KeySources::from_raw(st.secret, st.secret_file, st.verify_secret_files)?,
            instance_id: st.instance_id,
        })
    }
}

impl HeldBounds {
    fn from_raw(st: &RawState) -> Result<Self, ConfigError> {
        Ok(Self {
            total: positive("state.max_parked", st.max_parked, 500)?,
            per_principal: positive(
                "state.max_parked_per_principal",
                st.max_parked_per_principal,
                100,
            )?,
            bytes: size(
                "state.max_parked_memory",
                st.max_parked_memory.as_deref(),
                "256MiB",
            )?,
        })
    }
}

impl KeySources {
    fn from_raw(
        secret: Option<String>,
        file: Option<String>,
        verify: Vec<String>,
    ) -> Result<Self, ConfigError> {
        if secret.is_some() && file.is_some() {
            return Err(invalid(
                "state.secret_file",
                "give state.secret or state.secret_file, not both",
            ));
        }
        match secret {
            Some(sec) if sec.len() < MIN_SECRET_BYTES => Err(invalid(
                "state.secret",
                format!("must be at least {MIN_SECRET_BYTES} bytes"),
            )),
            other => Ok(Self {
                secret: other.map(Secret::new),
                secret_file: file.map(PathBuf::from),
                verify_files: verify.into_iter().map(PathBuf::from).collect(),
            }),
        }
    }
}

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
