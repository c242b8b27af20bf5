//! The processes the harness runs, all on 127.0.0.1: the legacy upstream (this benchmark binary
//! again, in its upstream role: the in-repo Rust demo server), nginx as the baseline reverse
//! proxy, and mrtr-proxy. With two CPUs or more the servers are pinned to CPU 0 and the load
//! generator to CPU 1 (`taskset`), so that they never compete for one core.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The environment variable that makes this binary the upstream.
pub(crate) const ROLE: &str = "MRTR_BENCH_ROLE";

/// A server process, killed however the benchmark ends.
pub(crate) struct Server {
    child: Child,
    /// Its MCP URL.
    pub(crate) url: String,
    /// Stopped with SIGTERM and waited for (a proxy under a profiler, which writes its output
    /// as it exits) rather than killed.
    graceful: bool,
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.graceful {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let until = Instant::now() + Duration::from_secs(60);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// Whether servers and load get a CPU each.
pub(crate) fn pinning() -> bool {
    // Decided once, before `pin_self` leaves this process a single CPU to see.
    static PINNING: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PINNING.get_or_init(|| cpus() >= 2 && Path::new("/usr/bin/taskset").exists())
}

/// The CPUs this process could use when it started.
pub(crate) fn cpus() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Pins this process (before it starts any thread) to CPU 1.
pub(crate) fn pin_self() {
    if pinning() {
        let _ = Command::new("taskset")
            .args(["-a", "-p", "-c", "1", &std::process::id().to_string()])
            .stdout(Stdio::null())
            .status();
    }
}

// `program args…`, on CPU 0 when pinning.
fn server_command(program: &Path) -> Command {
    if pinning() {
        let mut c = Command::new("taskset");
        c.args(["-c", "0"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// The upstream role: serve the demo upstream until stdin closes (the harness going away).
pub(crate) fn serve_upstream() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let up = mrtr_proxy::demo::upstream::DemoUpstream::start()
            .await
            .expect("upstream");
        println!("{}", up.url());
        let _ = tokio::task::spawn_blocking(|| {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
        })
        .await;
    });
}

/// Starts the upstream (this binary in its upstream role).
pub(crate) fn start_upstream() -> Server {
    let exe = std::env::current_exe().expect("current exe");
    let mut child = server_command(&exe)
        .env(ROLE, "upstream")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn upstream");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("upstream url");
    Server {
        child,
        url: line.trim().to_owned(),
        graceful: false,
    }
}

/// Starts mrtr-proxy in front of `upstream` with `config` (TOML), under the tool
/// `MRTR_BENCH_PROXY_WRAPPER` names (e.g. `valgrind --tool=callgrind`) if any.
pub(crate) fn start_proxy(upstream: &str, config: &str, dir: &Path) -> Server {
    start_proxy_under(upstream, config, dir, "MRTR_BENCH_PROXY_WRAPPER")
}

/// As [`start_proxy`], under the tool the environment variable `wrapper` names. The proxy does
/// not see this process's `OTEL_*` variables (they would override its `[telemetry]`).
pub(crate) fn start_proxy_under(upstream: &str, config: &str, dir: &Path, wrapper: &str) -> Server {
    let path = dir.join(format!("proxy-{}.toml", unique()));
    std::fs::write(&path, config).expect("proxy config");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_mrtr-proxy"));
    let (mut cmd, graceful) = wrapped(&bin, wrapper);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("OTEL_") {
            cmd.env_remove(name);
        }
    }
    let (child, url) = super::support::launch_proxy(cmd, upstream, &path);
    Server {
        child,
        url,
        graceful,
    }
}

// `program`, under the tool the environment variable `var` names (if any), on CPU 0 when
// pinning; and whether it must be stopped gracefully so that the tool writes its output.
fn wrapped(program: &Path, var: &str) -> (Command, bool) {
    let wrapper = std::env::var(var).unwrap_or_default();
    let mut words = wrapper.split_whitespace();
    match words.next() {
        Some(tool) => {
            let mut c = server_command(Path::new(tool));
            c.args(words).arg(program);
            (c, true)
        }
        None => (server_command(program), false),
    }
}

/// The nginx binary, if installed.
pub(crate) fn nginx_binary() -> Option<PathBuf> {
    ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Starts nginx (one process: no master, so that killing it leaves no worker behind; buffering
/// off, upstream keep-alive) in front of `upstream`.
pub(crate) fn start_nginx(bin: &Path, upstream: &str, dir: &Path) -> Server {
    let up = upstream.strip_prefix("http://").expect("http url");
    let (up_host, path) = up.split_at(up.find('/').unwrap_or(up.len()));
    // nginx cannot report a port it chose: take a free one and hand it over.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let prefix = dir.join(format!("nginx-{}", unique()));
    std::fs::create_dir_all(prefix.join("logs")).expect("nginx dir");
    let conf = format!(
        "worker_processes 1;\nmaster_process off;\ndaemon off;\npid {pid};\nerror_log stderr error;\n\
         events {{ worker_connections 8192; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {tmp};\n  proxy_temp_path {tmp};\n\
           upstream up {{ server {up_host}; keepalive 256; }}\n\
           server {{\n    listen 127.0.0.1:{port};\n    location / {{\n\
               proxy_pass http://up;\n      proxy_http_version 1.1;\n\
               proxy_set_header Connection \"\";\n      proxy_buffering off;\n\
               proxy_request_buffering off;\n      proxy_read_timeout 300s;\n    }}\n  }}\n}}\n",
        pid = prefix.join("nginx.pid").display(),
        tmp = prefix.display(),
    );
    let conf_path = prefix.join("nginx.conf");
    std::fs::write(&conf_path, conf).expect("nginx.conf");
    // `MRTR_BENCH_NGINX_WRAPPER` profiles the baseline the same way as the proxy.
    let (mut cmd, graceful) = wrapped(bin, "MRTR_BENCH_NGINX_WRAPPER");
    let child = cmd
        .arg("-p")
        .arg(&prefix)
        .arg("-c")
        .arg(&conf_path)
        .arg("-e")
        .arg("stderr")
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn nginx");
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let until = Instant::now() + Duration::from_secs(if graceful { 60 } else { 10 });
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < until, "nginx did not start listening");
        std::thread::sleep(Duration::from_millis(20));
    }
    Server {
        child,
        url: format!("http://127.0.0.1:{port}{path}"),
        graceful,
    }
}

pub(crate) use super::support::rss_kib;

/// CPU time `pid` has had so far, in ns: every thread, user and kernel
/// (`/proc/PID/task/*/schedstat`, scheduler-accurate rather than in clock ticks).
pub(crate) fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Open file descriptors of `pid`.
pub(crate) fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// This process's soft limit on open files (`ulimit -n`).
pub(crate) fn nofile_limit() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        })
        .unwrap_or(1024)
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}
