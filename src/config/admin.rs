//! `[admin]`: where the operator's routes (`/healthz`, `/readyz`, `/metrics`) listen.

use std::net::SocketAddr;

use serde::Deserialize;

use super::error::{invalid, ConfigError};

/// `[admin]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawAdmin {
    /// `listen`
    pub listen: Option<String>,
}

/// `[admin]`, validated.
#[derive(Debug, Clone, Default)]
pub struct Admin {
    /// Separate address for `/healthz`, `/readyz`, `/metrics`; `None` serves them on
    /// `server.listen`.
    pub listen: Option<SocketAddr>,
}

impl Admin {
    pub(super) fn from_raw(raw: RawAdmin) -> Result<Self, ConfigError> {
        let listen = raw
            .listen
            .map(|a| a.parse().map_err(|e| invalid("admin.listen", e)))
            .transpose()?;
        Ok(Self { listen })
    }
}
