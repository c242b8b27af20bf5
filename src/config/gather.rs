//! `[state] gather`, `gather_window`, `gather_max_targets`: when a round waits for more server
//! requests (what the modes do is in `call::gather`).

use std::time::Duration;

use super::error::{invalid, positive, ConfigError};
use super::units::parse_duration;

/// When a round waits out `state.gather_window` for more server requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatherMode {
    /// Per target, as learned: unknown and together-asking targets wait, one-at-a-time
    /// targets do not.
    Learn,
    /// Every round waits the window.
    Always,
    /// No round waits: only what already arrived joins it.
    Never,
}

/// How server requests arriving together are gathered into one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gathering {
    /// When a round waits.
    pub mode: GatherMode,
    /// How long a round that waits does.
    pub window: Duration,
    /// How many targets `learn` remembers.
    pub max_targets: usize,
}

impl Gathering {
    /// From `state.gather`, `state.gather_window` and `state.gather_max_targets` as written.
    pub(super) fn from_raw(
        gather: Option<&str>,
        window: Option<&str>,
        max_targets: Option<usize>,
    ) -> Result<Self, ConfigError> {
        let window = window.unwrap_or("10ms");
        Ok(Self {
            mode: mode(gather)?,
            window: parse_duration(window).map_err(|e| invalid("state.gather_window", e))?,
            max_targets: positive("state.gather_max_targets", max_targets, 4096)?,
        })
    }
}

fn mode(raw: Option<&str>) -> Result<GatherMode, ConfigError> {
    match raw.unwrap_or("learn") {
        "learn" => Ok(GatherMode::Learn),
        "always" => Ok(GatherMode::Always),
        "never" => Ok(GatherMode::Never),
        other => Err(invalid(
            "state.gather",
            format!("`{other}` is not learn, always or never"),
        )),
    }
}
