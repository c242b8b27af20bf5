//! `[upstream] transport`, `command`, `env`, `cwd`, `max_processes`: how the proxy reaches its
//! legacy server.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::error::{invalid, positive, ConfigError};

/// How the proxy talks to the legacy upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamTransport {
    /// Streamable HTTP, falling back to HTTP+SSE when the URL refuses a POSTed `initialize`
    /// with a 4xx (the spec's backwards-compatibility procedure); what it found is kept.
    Auto,
    /// Streamable HTTP (2025-03-26 and later) only.
    StreamableHttp,
    /// HTTP+SSE (2024-11-05): `GET` the URL, POST to the endpoint it announces.
    Sse,
    /// A child process speaking newline-delimited JSON-RPC on stdin / stdout.
    Stdio(StdioCommand),
}

impl UpstreamTransport {
    /// The name used in the config and in logs.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::StreamableHttp => "streamable-http",
            Self::Sse => "sse",
            Self::Stdio(_) => "stdio",
        }
    }
}

/// The stdio server's command line and environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdioCommand {
    /// The program (looked up on `PATH`).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables set for it, besides the few passed on from the proxy's environment.
    pub env: BTreeMap<String, String>,
    /// Its working directory (default: the proxy's).
    pub cwd: Option<PathBuf>,
    /// Upper bound on children at once (each is one session).
    pub max_processes: usize,
}

impl StdioCommand {
    /// A command line with no extra environment and the default bound on children.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for an empty command line.
    pub fn new(argv: Vec<String>) -> Result<Self, ConfigError> {
        let mut argv = argv.into_iter();
        let Some(program) = argv.next().filter(|p| !p.is_empty()) else {
            return Err(invalid("upstream.command", "must name a program"));
        };
        Ok(Self {
            program,
            args: argv.collect(),
            env: BTreeMap::new(),
            cwd: None,
            max_processes: DEFAULT_MAX_PROCESSES,
        })
    }
}

/// Default `upstream.max_processes`.
pub const DEFAULT_MAX_PROCESSES: usize = 16;

/// The transport keys of `[upstream]` as written.
pub(super) struct RawTransport<'a> {
    pub(super) transport: Option<&'a str>,
    pub(super) command: Option<&'a Vec<String>>,
    pub(super) env: &'a BTreeMap<String, String>,
    pub(super) cwd: Option<&'a str>,
    pub(super) max_processes: Option<usize>,
}

/// Validates the transport keys of `[upstream]`.
pub(super) fn from_raw(u: &RawTransport<'_>) -> Result<UpstreamTransport, ConfigError> {
    if u.command.is_none() && (!u.env.is_empty() || u.cwd.is_some()) {
        return Err(invalid(
            "upstream.command",
            "`env` and `cwd` are for a stdio server: they need a `command`",
        ));
    }
    // Checked whatever the transport (only a stdio one uses it).
    let max_processes = positive(
        "upstream.max_processes",
        u.max_processes,
        DEFAULT_MAX_PROCESSES,
    )?;
    let name = u
        .transport
        .unwrap_or(if u.command.is_some() { "stdio" } else { "auto" });
    let transport = match name {
        "auto" => UpstreamTransport::Auto,
        "streamable-http" => UpstreamTransport::StreamableHttp,
        "sse" => UpstreamTransport::Sse,
        "stdio" => {
            let Some(argv) = u.command.cloned() else {
                return Err(invalid(
                    "upstream.command",
                    "transport = \"stdio\" needs a command",
                ));
            };
            let mut cmd = StdioCommand::new(argv)?;
            cmd.env = u.env.clone();
            cmd.cwd = u.cwd.map(PathBuf::from);
            cmd.max_processes = max_processes;
            return Ok(UpstreamTransport::Stdio(cmd));
        }
        other => {
            return Err(invalid(
                "upstream.transport",
                format!("`{other}`: expected auto, streamable-http, sse or stdio"),
            ))
        }
    };
    if u.command.is_some() {
        return Err(invalid(
            "upstream.command",
            format!(
                "a command runs a stdio server, not one over {}",
                transport.name()
            ),
        ));
    }
    Ok(transport)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn a_command_means_stdio_and_keeps_its_environment() {
        let c = Config::from_toml_str(
            "[upstream]\ncommand = [\"node\", \"server.js\", \"--stdio\"]\nenv = { A = \"1\" }\nmax_processes = 3\n",
        )
        .unwrap();
        let UpstreamTransport::Stdio(cmd) = c.upstream.transport else {
            panic!("not stdio: {:?}", c.upstream.transport);
        };
        assert_eq!(cmd.program, "node");
        assert_eq!(cmd.args, ["server.js", "--stdio"]);
        assert_eq!(cmd.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(cmd.max_processes, 3);
        assert_eq!(
            Config::defaults().unwrap().upstream.transport,
            UpstreamTransport::Auto
        );
    }
}
