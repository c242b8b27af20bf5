//! `[pool]`: how many upstream sessions are kept, and for how long.

use std::time::Duration;

use serde::Deserialize;

use super::error::{positive, ConfigError};
use super::units::{duration, nonzero_duration};

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
}

impl Pool {
    pub(super) fn from_raw(p: RawPool) -> Result<Self, ConfigError> {
        Ok(Self {
            max_sessions: positive("pool.max_sessions", p.max_sessions, 512)?,
            idle_timeout: nonzero_duration("pool.idle_timeout", p.idle_timeout.as_deref(), "5m")?,
            acquire_timeout: duration("pool.acquire_timeout", p.acquire_timeout.as_deref(), "10s")?,
        })
    }
}
