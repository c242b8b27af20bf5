//! `[telemetry]`: OpenTelemetry traces exported over OTLP/HTTP (protobuf). Off unless an
//! endpoint is given, here or in `OTEL_EXPORTER_OTLP_ENDPOINT` (the standard variables win:
//! `main.rs` applies them).

use std::time::Duration;

use serde::Deserialize;

use super::error::{invalid, positive, ConfigError};
use super::units::nonzero_duration;

/// `[telemetry]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTelemetry {
    /// `otlp_endpoint`
    pub otlp_endpoint: Option<String>,
    /// `service_name`
    pub service_name: Option<String>,
    /// `sample_ratio`
    pub sample_ratio: Option<f64>,
    /// `max_queue`
    pub max_queue: Option<usize>,
    /// `export_timeout`
    pub export_timeout: Option<String>,
}

/// `[telemetry]`, validated.
#[derive(Debug, Clone)]
pub struct Telemetry {
    /// Where traces go: `<endpoint>/v1/traces` (a full `…/v1/traces` URL is taken as it is).
    /// `None`: tracing export is off.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// Share of traces sampled when the request's parent does not decide (parent-based).
    pub sample_ratio: f64,
    /// Spans held for export at most; past it new spans are dropped (and counted).
    pub max_queue: usize,
    /// How long one export may take.
    pub export_timeout: Duration,
}

impl Telemetry {
    pub(super) fn from_raw(raw: RawTelemetry) -> Result<Self, ConfigError> {
        let t = Self {
            otlp_endpoint: raw.otlp_endpoint.filter(|e| !e.is_empty()),
            service_name: raw.service_name.unwrap_or_else(|| "mrtr-proxy".to_owned()),
            sample_ratio: raw.sample_ratio.unwrap_or(1.0),
            max_queue: positive("telemetry.max_queue", raw.max_queue, 2048)?,
            export_timeout: nonzero_duration(
                "telemetry.export_timeout",
                raw.export_timeout.as_deref(),
                "5s",
            )?,
        };
        t.check()
    }

    /// Checks values that may also come from the environment.
    ///
    /// # Errors
    /// The key that is wrong.
    pub fn check(self) -> Result<Self, ConfigError> {
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err(invalid("telemetry.sample_ratio", "must be between 0 and 1"));
        }
        if let Some(e) = &self.otlp_endpoint {
            let ok = e.parse::<http::Uri>().is_ok_and(|u| {
                matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some()
            });
            if !ok {
                return Err(invalid(
                    "telemetry.otlp_endpoint",
                    "must be an absolute http:// or https:// URL",
                ));
            }
        }
        Ok(self)
    }

    /// Whether traces are exported.
    pub fn is_enabled(&self) -> bool {
        self.otlp_endpoint.is_some()
    }
}
