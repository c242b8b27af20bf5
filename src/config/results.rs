//! `[results]`: the cache hints stamped on results that had no round.

use serde::Deserialize;

use super::error::{invalid, ConfigError};

/// `[results]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawResults {
    /// `ttl_ms`
    pub ttl_ms: Option<u64>,
    /// `cache_scope`
    pub cache_scope: Option<String>,
}

/// `[results]`, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Results {
    /// `ttlMs` stamped on cacheable results.
    pub ttl_ms: u64,
    /// `cacheScope` stamped on cacheable results.
    pub scope: CacheScope,
}

/// `cacheScope` stamped on cacheable results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheScope {
    /// May be shared across users.
    Public,
    /// Per authorization context (the safe default).
    Private,
}

impl Results {
    pub(super) fn from_raw(r: RawResults) -> Result<Self, ConfigError> {
        let scope = match r.cache_scope.as_deref().unwrap_or("private") {
            "private" => CacheScope::Private,
            "public" => CacheScope::Public,
            other => {
                return Err(invalid(
                    "results.cache_scope",
                    format!("`{other}` is not public or private"),
                ))
            }
        };
        Ok(Self {
            ttl_ms: r.ttl_ms.unwrap_or(0),
            scope,
        })
    }
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
