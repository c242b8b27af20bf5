//! How a configuration is refused: the error naming the bad key, and the checks every part of
//! the config shares.

use std::fmt;

/// Why a configuration was rejected. The message always names the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The TOML did not parse or has unknown keys / wrong types.
    #[error("invalid config: {0}")]
    Toml(#[from] toml::de::Error),
    /// A key has a value that parses but is not acceptable.
    #[error("invalid value for `{key}`: {reason}")]
    Invalid {
        /// Dotted key name, e.g. `state.ttl`.
        key: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

pub(super) fn invalid(key: &'static str, reason: impl fmt::Display) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.to_string(),
    }
}

pub(super) fn positive(
    key: &'static str,
    v: Option<usize>,
    default: usize,
) -> Result<usize, ConfigError> {
    match v.unwrap_or(default) {
        0 => Err(invalid(key, "must be at least 1")),
        n => Ok(n),
    }
}
