//! Command line: `mrtr-proxy [--config FILE] [--listen ADDR] [--upstream URL] [--state-ttl D]
//! [-- COMMAND ARGS…]`,
//! `mrtr-proxy check-config FILE` (or `--config FILE`), `mrtr-proxy healthcheck [--url URL]`,
//! `mrtr-proxy demo [--once]`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// MCP sidecar: a 2026-07-28 (MRTR) front for a legacy server (Streamable HTTP, HTTP+SSE or stdio).
#[derive(Debug, Parser)]
#[command(name = "mrtr-proxy", version, about)]
pub struct Cli {
    /// TOML configuration file (every key optional; see config/mrtr-proxy.toml).
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    /// Listen address, overrides `server.listen`.
    #[arg(long, global = true)]
    pub listen: Option<SocketAddr>,
    /// Upstream legacy MCP endpoint, overrides `upstream.url`.
    #[arg(long)]
    pub upstream: Option<String>,
    /// Lifetime of a requestState / parked call (e.g. `30s`, `5m`), overrides `state.ttl`.
    #[arg(long)]
    pub state_ttl: Option<String>,
    /// A stdio server to run as the upstream, after `--` (e.g. `-- python server.py`); overrides
    /// `upstream.command`. Its `env`, `cwd` and `max_processes` still come from the config.
    #[arg(last = true, value_name = "STDIO_SERVER")]
    pub upstream_command: Vec<String>,
    /// What to do (default: serve).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a configuration file and the key files it names, and exit (non-zero, naming
    /// the bad key or file, if invalid).
    CheckConfig {
        /// The file to check (or `--config FILE`, as the proxy itself takes it).
        file: Option<PathBuf>,
    },
    /// Probe the running proxy's `/healthz` (the container HEALTHCHECK: distroless has no curl);
    /// exit 0 when it answers 200. The address comes from `--url`, else from the config
    /// (`admin.listen`, else `server.listen`; an unspecified IP means loopback).
    Healthcheck {
        /// Full URL to probe instead, e.g. `http://127.0.0.1:9090/readyz`.
        #[arg(long)]
        url: Option<String>,
    },
    /// Run a built-in legacy server behind the proxy and walk a modern client through it.
    Demo {
        /// Exit after the walkthrough (status 0 if every step passed).
        #[arg(long)]
        once: bool,
        /// How the proxy reaches the built-in server: `http` (Streamable HTTP), `sse`
        /// (HTTP+SSE, found from its /sse URL) or `stdio` (run as the proxy's child).
        #[arg(long, value_enum, default_value_t = DemoTransport::Http)]
        upstream_transport: DemoTransport,
    },
    /// The built-in demo server on stdin/stdout (what `demo --upstream-transport stdio` runs).
    #[command(hide = true)]
    DemoUpstream,
}

/// The legacy transport of the demo's built-in server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DemoTransport {
    /// Streamable HTTP.
    Http,
    /// HTTP+SSE.
    Sse,
    /// A stdio child process.
    Stdio,
}
