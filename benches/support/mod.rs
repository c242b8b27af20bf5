//! What the benchmarks share: the proxy binary started on port 0 with a config of their own, and
//! a process's resident memory.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Runs a benchmark's body on a two-worker runtime (the machine has two cores).
pub(crate) fn block_on(body: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(body);
}

/// The proxy process, killed however the benchmark ends.
pub(crate) struct ProxyProcess(Child);

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl ProxyProcess {
    /// The process id.
    pub(crate) fn id(&self) -> u32 {
        self.0.id()
    }
}

/// Starts the proxy binary in front of `upstream` with `config` (TOML); returns it and its MCP
/// URL.
pub(crate) fn spawn_proxy(upstream: &str, name: &str, config: &str) -> (ProxyProcess, String) {
    let path = std::env::temp_dir().join(format!("mrtr-{name}-{}.toml", std::process::id()));
    std::fs::write(&path, config).expect("bench config");
    let (child, url) = launch_proxy(
        Command::new(env!("CARGO_BIN_EXE_mrtr-proxy")),
        upstream,
        &path,
    );
    (ProxyProcess(child), url)
}

/// Runs `command` (the proxy binary, or a tool with the binary as its last argument) on port 0
/// in front of `upstream` with the config file at `config`; returns the child and its MCP URL
/// once it listens. Its stderr is drained so that it never blocks on a full pipe.
pub(crate) fn launch_proxy(
    mut command: Command,
    upstream: &str,
    config: &std::path::Path,
) -> (Child, String) {
    let mut child = command
        .args([
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            upstream,
            "--config",
        ])
        .arg(config)
        .env("RUST_LOG", "error")
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn proxy");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let line = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("listening on"))
        .expect("listening line");
    std::thread::spawn(move || for _ in lines {});
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("url")
        .to_owned();
    (child, url)
}

/// The value of environment variable `name`, or `default` when it is unset or does not parse.
#[allow(dead_code, reason = "not every bench that shares this module reads it")]
pub(crate) fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Resident memory of process `pid`, in KiB.
pub(crate) fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// Resident anonymous memory of process `pid` (its heap and stacks: not the pages of its
/// program, which the first requests page in once), in KiB.
#[allow(dead_code, reason = "not every bench that shares this module reads it")]
pub(crate) fn rss_anon_kib(pid: u32) -> u64 {
    status_kib(pid, "RssAnon:")
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("proc status")
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect(field)
}
