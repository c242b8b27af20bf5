//! `[log]`: how the proxy logs (the subscriber itself is set up in `telemetry`).

use serde::Deserialize;

use super::error::{invalid, ConfigError};

/// `[log]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLog {
    /// `format`
    pub format: Option<String>,
    /// `level`
    pub level: Option<String>,
}

/// `[log]`, validated.
#[derive(Debug, Clone)]
pub struct Log {
    /// Log line format.
    pub format: LogFormat,
    /// Log filter (`tracing` directives, e.g. `info` or `mrtr_proxy=debug`); `RUST_LOG` wins.
    pub level: String,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (coloured on a terminal).
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

impl Log {
    pub(super) fn from_raw(raw: RawLog) -> Result<Self, ConfigError> {
        let format = match raw.format.as_deref().unwrap_or("text") {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => {
                return Err(invalid(
                    "log.format",
                    format!("`{other}` is not text or json"),
                ))
            }
        };
        let level = raw.level.unwrap_or_else(|| "info".to_owned());
        tracing_subscriber::EnvFilter::try_new(&level).map_err(|e| invalid("log.level", e))?;
        Ok(Self { format, level })
    }
}
