//! Wiring only: parse the command line, load and validate config, start telemetry, run.

use std::process::ExitCode;

use clap::Parser;
use mrtr_proxy::app::App;
use mrtr_proxy::cli::{Cli, Command};
use mrtr_proxy::config::{self, Config};
use mrtr_proxy::demo;
use mrtr_proxy::ops::{healthcheck, shutdown, telemetry};
use mrtr_proxy::server::{self, Listeners};

// Config errors exit with EX_USAGE so supervisors can tell them from crashes.
const EXIT_CONFIG: u8 = 64;

// jemalloc, with its background threads on, gives freed memory back to the system: 15 s after
// 3 000 parked calls expired (`cargo bench --bench parked_memory`), RSS was 27-29 MB again from a
// 9 MB start, cycle after cycle, where mimalloc kept 99-155 MB (its live heap was 3 MB: the rest
// was retained, not leaked) and the system allocator kept growing (237 → 281 → 292 MB). Calls
// cost the same with either (`cargo bench --bench round_trip`).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    // Purging freed memory on a timer, not only when some thread next allocates.
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        eprintln!("mrtr-proxy: jemalloc background threads stay off: {e}");
    }
    let cli = Cli::parse();
    if let Some(Command::DemoUpstream) = &cli.command {
        // stdout is the protocol here: no logging set up.
        return match mrtr_proxy::demo::transports::serve_stdio().await {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::FAILURE,
        };
    }
    if let Some(Command::CheckConfig { file }) = &cli.command {
        let Some(file) = checked_file(file.as_ref(), cli.config.as_ref()) else {
            return ExitCode::from(EXIT_CONFIG);
        };
        // What start-up reads is read too (key files, secrets, the task store's password): what
        // cannot be used fails here, not at start-up. Bounds that do not add up are said, as at
        // start-up, without failing the check.
        let verdict = load(Some(file)).and_then(|c| match App::check(&c) {
            Ok(()) => Ok(c.sizing_warnings(u64::MAX)),
            Err(e) => Err(e.to_string()),
        });
        let verdict = verdict.map(|warnings| {
            for w in warnings {
                eprintln!("{}: warning: {w}", file.display());
            }
            "ok".to_owned()
        });
        eprintln!(
            "{}: {}",
            file.display(),
            verdict.as_deref().unwrap_or_else(|e| e)
        );
        return verdict.map_or(ExitCode::from(EXIT_CONFIG), |_| ExitCode::SUCCESS);
    }
    let config = match load(cli.config.as_ref()).and_then(|c| apply_flags(c, &cli)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mrtr-proxy: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match cli.command {
        Some(Command::Healthcheck { url }) => {
            let url = url.unwrap_or_else(|| healthcheck::default_url(&config));
            match healthcheck::probe(&url).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("mrtr-proxy healthcheck: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Some(Command::Demo {
            once,
            upstream_transport,
        }) => {
            telemetry::init_with(config.log.format, demo::LOG_LEVEL);
            let options = demo::Options {
                listen: cli.listen,
                once,
                transport: upstream_transport,
            };
            match demo::run(config, options, shutdown::signal()).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(_) => ExitCode::FAILURE,
            }
        }
        _ => serve(config).await,
    }
}

async fn serve(mut config: Config) -> ExitCode {
    let instance = mrtr_proxy::app::fix_instance_id(&mut config.state);
    let exporting = telemetry::init_exporting(
        config.log.format,
        &config.log.level,
        (&config.telemetry, &instance),
    );
    if let Some(descriptors) = server::raise_descriptor_limit() {
        let room = config.fit_descriptors(descriptors);
        tracing::info!(
            descriptors,
            parked_calls_room = room,
            max_parked = config.state.parked.total,
            max_parked_memory = config.state.parked.bytes,
            pool_max_sessions = config.pool.max_sessions,
            max_listen_sessions_per_principal = config.pool.max_listen_sessions_per_principal,
            max_legacy_sessions_per_principal = config.server.max_legacy_sessions_per_principal,
            "bounds sized (a sized bound follows memory and open files; one the file sets is kept)"
        );
        for warning in config.sizing_warnings(room) {
            tracing::warn!("{warning}");
        }
    }
    let mcp_path = config.server.mcp_path.clone();
    let admin_listen = config.admin.listen;
    let listen = config.server.listen;
    let app = match App::new(config) {
        Ok(app) => app,
        Err(e) => {
            eprintln!("mrtr-proxy: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let bind = |addr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| eprintln!("mrtr-proxy: cannot listen on {addr}: {e}"))
    };
    let upstream = app.upstream_name();
    let Ok(main) = bind(listen).await else {
        return ExitCode::FAILURE;
    };
    let admin = match admin_listen {
        Some(addr) => match bind(addr).await {
            Ok(l) => Some(l),
            Err(()) => return ExitCode::FAILURE,
        },
        None => None,
    };
    let bound = |l: &tokio::net::TcpListener| {
        l.local_addr()
            .map_or_else(|_| "?".into(), |a| a.to_string())
    };
    // Plain lines on stderr so supervisors and tests learn the bound ports (listen on :0 works).
    eprintln!(
        "mrtr-proxy listening on http://{}{} -> {}",
        bound(&main),
        mcp_path,
        upstream
    );
    if let Some(a) = &admin {
        eprintln!("mrtr-proxy admin on http://{}", bound(a));
    }
    server::serve(Listeners { main, admin }, app, shutdown::signal()).await;
    if let Some(exporting) = exporting {
        // The batch exporter's own thread blocks while it flushes.
        let _ = tokio::task::spawn_blocking(move || exporting.shutdown()).await;
    }
    ExitCode::SUCCESS
}

// The file `check-config` checks: the positional, or `--config` as the proxy takes it (the
// same file twice is fine); `None`, said on stderr, when neither or two different ones.
fn checked_file<'a>(
    positional: Option<&'a std::path::PathBuf>,
    flag: Option<&'a std::path::PathBuf>,
) -> Option<&'a std::path::PathBuf> {
    match (positional, flag) {
        (Some(a), Some(b)) if a != b => {
            eprintln!(
                "mrtr-proxy check-config: two files given ({} and --config {}); give one",
                a.display(),
                b.display()
            );
            None
        }
        (Some(file), _) | (None, Some(file)) => Some(file),
        (None, None) => {
            eprintln!("mrtr-proxy check-config: which file? `mrtr-proxy check-config FILE` or `--config FILE`");
            None
        }
    }
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
        c.server.listen = l;
    }
    if !cli.upstream_command.is_empty() {
        if cli.upstream.is_some() {
            return Err("give --upstream URL or a command after --, not both".into());
        }
        let mut cmd = config::StdioCommand::new(cli.upstream_command.clone())
            .map_err(|e| format!("--: {e}"))?;
        if let config::UpstreamTransport::Stdio(from_file) = &c.upstream.transport {
            cmd.env = from_file.env.clone();
            cmd.cwd = from_file.cwd.clone();
            cmd.max_processes = from_file.max_processes;
        }
        c.upstream.transport = config::UpstreamTransport::Stdio(cmd);
    }
    if let Some(u) = &cli.upstream {
        if let config::UpstreamTransport::Stdio(_) = c.upstream.transport {
            c.upstream.transport = config::UpstreamTransport::Auto;
        }
        c.upstream.url = config::parse_upstream(u).map_err(|e| format!("--upstream: {e}"))?;
    }
    if let Some(t) = &cli.state_ttl {
        c.state.ttl = config::parse_duration(t).map_err(|e| format!("--state-ttl: {e}"))?;
    }
    c.telemetry = otel_env(c.telemetry)?;
    // Each replica's own address (a pod's IP), which one shared file cannot hold.
    if let Some(a) = std::env::var("MRTR_CLUSTER_ADVERTISE")
        .ok()
        .filter(|v| !v.is_empty())
    {
        c.cluster.advertise =
            Some(config::parse_upstream(&a).map_err(|e| format!("MRTR_CLUSTER_ADVERTISE: {e}"))?);
    }
    Ok(c)
}

// The standard OpenTelemetry variables win over `[telemetry]`.
fn otel_env(mut t: config::Telemetry) -> Result<config::Telemetry, String> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    if let Some(e) =
        var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT"))
    {
        t.otlp_endpoint = Some(e);
    }
    if let Some(name) = var("OTEL_SERVICE_NAME") {
        t.service_name = name;
    }
    match var("OTEL_TRACES_SAMPLER").as_deref() {
        Some("always_on" | "parentbased_always_on") => t.sample_ratio = 1.0,
        Some("always_off" | "parentbased_always_off") => t.sample_ratio = 0.0,
        _ => {}
    }
    if let Some(arg) = var("OTEL_TRACES_SAMPLER_ARG") {
        t.sample_ratio = arg
            .parse()
            .map_err(|_| format!("OTEL_TRACES_SAMPLER_ARG: `{arg}` is not a ratio"))?;
    }
    t.check().map_err(|e| e.to_string())
}
