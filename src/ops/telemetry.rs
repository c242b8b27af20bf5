//! Tracing setup: logs go to stderr, human-readable (coloured on a terminal) or one JSON object
//! per line; the filter is `RUST_LOG` when set, else the configured level.

use crate::config::LogFormat;

/// Installs the global subscriber at `info`, human-readable (once; later calls are no-ops).
pub fn init() {
    init_with(LogFormat::Text, "info");
}

/// Installs the global subscriber with `format` and the filter `level` (`RUST_LOG` wins when set;
/// a filter that does not parse falls back to `info`). Once; later calls are no-ops.
pub fn init_with(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // A closed stderr must not crash the proxy (the default reports via eprintln!, which panics).
        .log_internal_errors(false)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
    };
}
