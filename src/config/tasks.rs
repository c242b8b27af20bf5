//! `[tasks]`: the persistent workflow of the `io.modelcontextprotocol/tasks` extension. A
//! `tools/call` from a client that declares the extension becomes a task when it has neither
//! finished nor asked for input within `after` (per tool: `always`, `never` or `after` in
//! `[tasks.tools]`, keyed by name or glob); the task then lives on this instance until `ttl`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::error::{invalid, positive, ConfigError};
use super::state::HeldBounds;
use super::units::{duration, nonzero_duration, size};

/// `[tasks]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTasks {
    /// `enabled`
    pub enabled: Option<bool>,
    /// `after`
    pub after: Option<String>,
    /// `ttl`
    pub ttl: Option<String>,
    /// `poll_interval`
    pub poll_interval: Option<String>,
    /// `max`
    pub max: Option<usize>,
    /// `max_per_principal`
    pub max_per_principal: Option<usize>,
    /// `max_memory`
    pub max_memory: Option<String>,
    /// `[tasks.tools]`
    pub tools: BTreeMap<String, String>,
}

/// When a tool's call becomes a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskMode {
    /// As soon as it is sent upstream.
    Always,
    /// Never: it stays an ordinary call, however long it runs.
    Never,
    /// When it has neither finished nor asked for input within `tasks.after`.
    After,
}

/// `[tasks]`, validated.
#[derive(Debug, Clone)]
pub struct Tasks {
    /// Whether the extension is offered at all.
    pub enabled: bool,
    /// How long a call runs (without finishing or asking) before it becomes a task.
    pub after: Duration,
    /// How long a task lives from its creation (`ttlMs`): a running one is cancelled upstream
    /// then, a finished one's result is kept until then.
    pub ttl: Duration,
    /// The poll interval suggested to clients (`pollIntervalMs`).
    pub poll_interval: Duration,
    /// Tasks on this instance (running and finished, until their TTL).
    pub max: usize,
    /// Tasks per principal.
    pub max_per_principal: usize,
    /// Memory charged to tasks in all (params, inputs asked, results, a fixed overhead each).
    pub max_memory: usize,
    /// Per-tool modes: exact names first, then globs (longest pattern first).
    tools: Vec<(String, Option<glob::Pattern>, TaskMode)>,
}

impl Tasks {
    pub(super) fn from_raw(raw: RawTasks) -> Result<Self, ConfigError> {
        let mut tools = raw
            .tools
            .into_iter()
            .map(|(pattern, mode)| {
                let mode = match mode.as_str() {
                    "always" => TaskMode::Always,
                    "never" => TaskMode::Never,
                    "after" => TaskMode::After,
                    _ => {
                        return Err(invalid(
                            "tasks.tools",
                            "want \"always\", \"never\" or \"after\"",
                        ))
                    }
                };
                let glob = if pattern.contains(['*', '?', '[']) {
                    let g = glob::Pattern::new(&pattern)
                        .map_err(|e| invalid("tasks.tools", format!("`{pattern}`: {e}")))?;
                    Some(g)
                } else {
                    None
                };
                Ok((pattern, glob, mode))
            })
            .collect::<Result<Vec<_>, _>>()?;
        tools.sort_by_key(|(p, g, _)| (g.is_some(), std::cmp::Reverse(p.len())));
        let ttl = nonzero_duration("tasks.ttl", raw.ttl.as_deref(), "1h")?;
        let after = duration("tasks.after", raw.after.as_deref(), "5s")?;
        if after >= ttl {
            return Err(invalid("tasks.after", "must be shorter than tasks.ttl"));
        }
        Ok(Self {
            enabled: raw.enabled.unwrap_or(true),
            after,
            ttl,
            poll_interval: nonzero_duration(
                "tasks.poll_interval",
                raw.poll_interval.as_deref(),
                "1s",
            )?,
            max: positive("tasks.max", raw.max, 1000)?,
            max_per_principal: positive("tasks.max_per_principal", raw.max_per_principal, 100)?,
            max_memory: size("tasks.max_memory", raw.max_memory.as_deref(), "80MiB")?,
            tools,
        })
    }

    /// The bounds on tasks held.
    pub fn bounds(&self) -> HeldBounds {
        HeldBounds {
            total: self.max,
            per_principal: self.max_per_principal,
            bytes: self.max_memory,
        }
    }

    /// Makes `tool` (an exact name) become a task in `mode`, over what the file said (the
    /// demo's slow tool).
    pub fn set_mode(&mut self, tool: &str, mode: TaskMode) {
        self.tools.retain(|(p, _, _)| p != tool);
        self.tools.insert(0, (tool.to_owned(), None, mode));
    }

    /// When a call of `tool` becomes a task.
    pub fn mode_for(&self, tool: &str) -> TaskMode {
        self.tools
            .iter()
            .find(|(p, g, _)| match g {
                Some(g) => g.matches(tool),
                None => p == tool,
            })
            .map_or(TaskMode::After, |(_, _, m)| *m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tasks(toml: &str) -> Result<Tasks, ConfigError> {
        Tasks::from_raw(toml::from_str(toml).unwrap())
    }

    #[test]
    fn defaults() {
        let t = tasks("").unwrap();
        assert!(t.enabled);
        assert_eq!(t.after, Duration::from_secs(5));
        assert_eq!(t.ttl, Duration::from_secs(3600));
        assert_eq!(t.mode_for("anything"), TaskMode::After);
    }

    #[test]
    fn exact_names_win_over_globs_and_longer_globs_win() {
        let t = tasks(
            r#"[tools]
            "report_*" = "always"
            "report_quick*" = "never"
            report_quickest = "after"
            "*" = "never""#,
        )
        .unwrap();
        assert_eq!(t.mode_for("report_big"), TaskMode::Always);
        assert_eq!(t.mode_for("report_quick1"), TaskMode::Never);
        assert_eq!(t.mode_for("report_quickest"), TaskMode::After);
        assert_eq!(t.mode_for("other"), TaskMode::Never);
    }

    #[test]
    fn bad_values_name_the_key() {
        let e = tasks("[tools]\nx = \"sometimes\"").unwrap_err();
        assert!(e.to_string().contains("tasks.tools"), "{e}");
        let e = tasks("after = \"2h\"").unwrap_err();
        assert!(e.to_string().contains("tasks.after"), "{e}");
        let e = tasks("max = 0").unwrap_err();
        assert!(e.to_string().contains("tasks.max"), "{e}");
    }
}
