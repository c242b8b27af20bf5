//! Tracing setup: logs go to stderr, human-readable (coloured on a terminal) or one JSON object
//! per line; the filter is `RUST_LOG` when set, else the configured level. With `[telemetry]`
//! exporting, the same spans also become OpenTelemetry spans sent over OTLP (`otlp`).

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use crate::config::{LogFormat, Telemetry};

mod bounded;
mod otlp;

pub use otlp::Exporting;

/// Set once traces are exported: the request path describes its spans for OpenTelemetry only
/// then (with export off, it costs one load).
static EXPORTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether traces are exported.
pub(crate) fn exporting() -> bool {
    EXPORTING.load(std::sync::atomic::Ordering::Relaxed)
}

/// Installs the global subscriber at `info`, human-readable (once; later calls are no-ops).
pub fn init() {
    init_with(LogFormat::Text, "info");
}

/// Installs the global subscriber with `format` and the filter `level` (`RUST_LOG` wins when set;
/// a filter that does not parse falls back to `info`). Once; later calls are no-ops.
pub fn init_with(format: LogFormat, level: &str) {
    let _ = install(format, level, None);
}

/// As [`init_with`], and exporting traces as `telemetry` says, as instance `instance` (the
/// `service.instance.id`). Returns what flushes the export at exit (`None` when off, or when
/// the exporter could not be built: logged, and the proxy runs without it).
pub fn init_exporting(
    format: LogFormat,
    level: &str,
    (telemetry, instance): (&Telemetry, &str),
) -> Option<Exporting> {
    let exporting = match Exporting::start(telemetry, instance) {
        Ok(e) => e,
        Err(why) => {
            let _ = install(format, level, None);
            tracing::warn!(error = %why, "traces are not exported");
            return None;
        }
    };
    let installed = install(format, level, exporting.as_ref());
    if installed.is_ok() && exporting.is_some() {
        EXPORTING.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    exporting
}

fn install(format: LogFormat, level: &str, exporting: Option<&Exporting>) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer()
        // A closed stderr must not crash the proxy (the default reports via eprintln!, which panics).
        .log_internal_errors(false)
        .with_writer(std::io::stderr);
    let logs = match format {
        LogFormat::Json => fmt
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .boxed(),
        LogFormat::Text => fmt
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
    };
    // Each layer has its own filter: the log level must not decide which spans are exported.
    tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(exporting.map(Exporting::layer))
        .try_init()
        .map_err(|e| e.to_string())
}
