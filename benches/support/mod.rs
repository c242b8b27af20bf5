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
/// URL. Its stderr is drained so that it never blocks on a full pipe.
pub(crate) fn spawn_proxy(upstream: &str, name: &str, config: &str) -> (ProxyProcess, String) {
    let path = std::env::temp_dir().join(format!("mrtr-{name}-{}.toml", std::process::id()));
    std::fs::write(&path, config).expect("bench config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mrtr-proxy"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            upstream,
            "--config",
        ])
        .arg(&path)
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
    (ProxyProcess(child), url)
}

/// Resident memory of process `pid`, in KiB.
pub(crate) fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("proc status")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}
