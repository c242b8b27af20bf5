//! `[replay]`: which calls may run again, from their token, on another replica when the one
//! that held them is gone, and how large a journal a token may carry.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::error::{invalid, ConfigError};
use super::units::size;

/// Largest `replay.max_state`: a token carries the journal on every retry.
pub const MAX_REPLAY_STATE_BYTES: usize = 10 * 1024;

/// `[replay]` as written.
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
    pub tools: BTreeMap<String, String>,
}

/// Whether a call may be run again, from its token, when the instance that held it is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayMode {
    /// Always replay-safe.
    Always,
    /// Never: a lost call gets the "call lost" error.
    Never,
    /// As the upstream's own `tools/list` annotations say: `readOnlyHint` or
    /// `idempotentHint` true.
    Annotations,
}

/// `[replay]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// Tools not named in `tools`.
    pub default: ReplayMode,
    /// Per-tool overrides.
    pub tools: BTreeMap<String, ReplayMode>,
    /// `prompts/get`.
    pub prompts: ReplayMode,
    /// `resources/read`.
    pub resources: ReplayMode,
    /// Largest journal (answers so far, as JSON) a token carries; a call whose answers grow
    /// past it is no longer replayable.
    pub max_state: usize,
}

impl Replay {
    pub(super) fn from_raw(r: RawReplay) -> Result<Self, ConfigError> {
        let mode =
            |key: &'static str, v: Option<&str>, default: ReplayMode, annotations: bool| match v {
                None => Ok(default),
                Some("always") => Ok(ReplayMode::Always),
                Some("never") => Ok(ReplayMode::Never),
                Some("annotations") if annotations => Ok(ReplayMode::Annotations),
                Some(_) if annotations => Err(invalid(
                    key,
                    "want \"annotations\", \"always\" or \"never\"",
                )),
                Some(_) => Err(invalid(key, "want \"always\" or \"never\"")),
            };
        let tools = r
            .tools
            .iter()
            .map(|(k, v)| {
                Ok((
                    k.clone(),
                    mode("replay.tools", Some(v), ReplayMode::Never, true)?,
                ))
            })
            .collect::<Result<_, ConfigError>>()?;
        let max_state = size("replay.max_state", r.max_state.as_deref(), "8KiB")?;
        if max_state > MAX_REPLAY_STATE_BYTES {
            return Err(invalid(
                "replay.max_state",
                "at most 10KiB (the token travels on every retry)",
            ));
        }
        Ok(Self {
            default: mode(
                "replay.default",
                r.default.as_deref(),
                ReplayMode::Annotations,
                true,
            )?,
            tools,
            prompts: mode(
                "replay.prompts",
                r.prompts.as_deref(),
                ReplayMode::Always,
                false,
            )?,
            resources: mode(
                "replay.resources",
                r.resources.as_deref(),
                ReplayMode::Always,
                false,
            )?,
            max_state,
        })
    }

    /// The mode of `method` on `target` (a tool name for `tools/call`).
    pub fn mode(&self, method: &str, target: &str) -> ReplayMode {
        match method {
            "tools/call" => self.tools.get(target).copied().unwrap_or(self.default),
            "prompts/get" => self.prompts,
            "resources/read" => self.resources,
            _ => ReplayMode::Never,
        }
    }
}
