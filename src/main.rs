//! Wiring only: parse the command line, load and validate config, start telemetry, run.

use std::process::ExitCode;

use clap::Parser;
use mrtr_proxy::app::App;
use mrtr_proxy::cli::{Cli, Command};
use mrtr_proxy::config::{self, Config};
use mrtr_proxy::{demo, server, shutdown, telemetry};

// Config errors exit with EX_USAGE so supervisors can tell them from crashes.
const EXIT_CONFIG: u8 = 64;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init();
    if let Some(Command::CheckConfig { file }) = &cli.command {
        return match load(Some(file)) {
            Ok(_) => {
                eprintln!("{}: ok", file.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{}: {e}", file.display());
                ExitCode::from(EXIT_CONFIG)
            }
        };
    }
    let config = match load(cli.config.as_ref()).and_then(|c| apply_flags(c, &cli)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mrtr-proxy: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Some(Command::Demo { once }) = cli.command {
        return match demo::run(config, cli.listen, once, shutdown::signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::FAILURE,
        };
    }
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mrtr-proxy: cannot listen on {}: {e}", config.listen);
            return ExitCode::FAILURE;
        }
    };
    let bound = listener
        .local_addr()
        .map_or_else(|_| config.listen.to_string(), |a| a.to_string());
    // One plain line on stderr so supervisors and tests learn the bound port (listen on :0 works).
    eprintln!(
        "mrtr-proxy listening on http://{bound}{} -> {}",
        config.mcp_path, config.upstream
    );
    server::run(listener, App::new(config), shutdown::signal()).await;
    ExitCode::SUCCESS
}

fn load(path: Option<&std::path::PathBuf>) -> Result<Config, String> {
    match path {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            Config::from_toml_str(&text).map_err(|e| e.to_string())
        }
        None => Config::defaults().map_err(|e| e.to_string()),
    }
}

fn apply_flags(mut c: Config, cli: &Cli) -> Result<Config, String> {
    if let Some(l) = cli.listen {
        c.listen = l;
    }
    if let Some(u) = &cli.upstream {
        c.upstream = config::parse_upstream(u).map_err(|e| format!("--upstream: {e}"))?;
    }
    if let Some(t) = &cli.state_ttl {
        c.state_ttl = config::parse_duration(t).map_err(|e| format!("--state-ttl: {e}"))?;
    }
    Ok(c)
}
