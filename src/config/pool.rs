//! `[pool]`: how many upstream sessions are kept, for how long, and how much of a client's
//! declared extensions may split them.

use std::time::Duration;

use serde::Deserialize;

use super::error::{positive, ConfigError};
use super::units::{duration, nonzero_duration, size};

/// `[pool]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawPool {
    /// `max_sessions`
    pub max_sessions: Option<usize>,
    /// `idle_timeout`
    pub idle_timeout: Option<String>,
    /// `acquire_timeout`
    pub acquire_timeout: Option<String>,
    /// `max_listen_sessions_per_principal`
    pub max_listen_sessions_per_principal: Option<usize>,
    /// `max_extensions`
    pub max_extensions: Option<String>,
    /// `max_extension_sets_per_principal`
    pub max_extension_sets_per_principal: Option<usize>,
}

/// `[pool]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// Upper bound on upstream sessions across all principals (a stdio upstream is bounded by
    /// `upstream.max_processes` instead).
    pub max_sessions: usize,
    /// Idle sessions are closed (DELETE) after this long.
    pub idle_timeout: Duration,
    /// How long a request waits for a session when the pool is full.
    pub acquire_timeout: Duration,
    /// Sessions the `subscriptions/listen` streams of one principal pin at once (unset: a share
    /// of the pool, see `sizing`).
    pub max_listen_sessions_per_principal: usize,
    /// Largest `clientCapabilities.extensions` a modern request passes on to the upstream, in
    /// bytes of its canonical JSON (the proxy's own extension left out); a larger one is
    /// refused (-32602). Default 4 KiB.
    pub max_extensions_bytes: usize,
    /// Distinct extension declarations the sessions of one principal carry at once; a request
    /// declaring another one past it is served as if it declared none. Default 16.
    pub max_extension_sets_per_principal: usize,
}

impl Pool {
    pub(super) fn from_raw(p: RawPool) -> Result<Self, ConfigError> {
        Ok(Self {
            max_sessions: positive("pool.max_sessions", p.max_sessions, 512)?,
            idle_timeout: nonzero_duration("pool.idle_timeout", p.idle_timeout.as_deref(), "5m")?,
            acquire_timeout: duration("pool.acquire_timeout", p.acquire_timeout.as_deref(), "10s")?,
            // Unset: a share of the pool, once its size is known (`sizing::shares`).
            max_listen_sessions_per_principal: positive(
                "pool.max_listen_sessions_per_principal",
                p.max_listen_sessions_per_principal,
                1,
            )?,
            max_extensions_bytes: size("pool.max_extensions", p.max_extensions.as_deref(), "4KiB")?,
            max_extension_sets_per_principal: positive(
                "pool.max_extension_sets_per_principal",
                p.max_extension_sets_per_principal,
                16,
            )?,
        })
    }
}
