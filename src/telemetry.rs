//! Tracing setup: `RUST_LOG` filters (default `info`), logs go to stderr.

/// Installs the global subscriber (once; later calls are no-ops).
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        // A closed stderr must not crash the proxy (the default reports via eprintln!, which panics).
        .log_internal_errors(false)
        .with_writer(std::io::stderr)
        .try_init();
}
