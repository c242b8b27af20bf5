//! `cargo bench --bench sidecar`: what mrtr-proxy adds to a call, side by side with nginx in
//! front of the same legacy server, in one run on loopback.
//!
//! Three ways to one upstream (the in-repo Rust demo server, in a process of its own): directly,
//! through nginx (one worker, buffering off, upstream keep-alive), and through mrtr-proxy. Each
//! latency figure is a sequential run on one keep-alive connection; every iteration runs every
//! target once, in a random order, so that the machine's noise hits all alike, and the table
//! gives the median over iterations. Then throughput at 32 connections, 1…1000 concurrent
//! eliciting calls, calls parked at once (memory per call, and back after they expire; a resume
//! and a legacy pass-through call timed while they wait, against the same proxy idle), and the
//! requestState sign + verify.
//!
//! Writes the table between the markers of `docs/BENCHMARKS.md` (or `MRTR_BENCH_OUT`; a partial
//! or wrapped run writes only to `MRTR_BENCH_OUT`).
//! `MRTR_BENCH_SMOKE=1` is a seconds-long run of every phase that writes nowhere (CI runs it
//! so that the harness cannot rot); `MRTR_BENCH_ONLY=latency|throughput|concurrency|capacity`
//! runs one phase and `MRTR_BENCH_TARGET` (part of a label, e.g. `modern`, or several joined by
//! `|`) times only the latency targets it names; `MRTR_BENCH_PROXY_WRAPPER` runs the proxy under
//! a tool (callgrind), `MRTR_BENCH_TRACING_WRAPPER` the proxies that export traces (`traces`).
//! Every loop is bounded in count and time.

#![allow(
    clippy::print_stdout,
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "a benchmark reports on stdout and fails loudly"
)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

mod capacity;
mod load;
mod peers;
mod phases;
mod report;
#[path = "../support/mod.rs"]
#[allow(
    dead_code,
    reason = "shared with the other benchmarks; this one uses part of it"
)]
mod support;
mod traces;
mod wire;

use peers::{Server, ROLE};
use report::Report;
use wire::Endpoint;

/// How much of everything one run does.
pub(crate) struct Plan {
    pub(crate) smoke: bool,
    pub(crate) rounds: usize,
    pub(crate) warmup: usize,
    pub(crate) iterations: usize,
    pub(crate) throughput_time: Duration,
    pub(crate) levels: Vec<usize>,
    pub(crate) level_time: Duration,
    pub(crate) parked: usize,
    pub(crate) parked_ttl: Duration,
    /// Resumes and legacy pass-through calls timed in the capacity phase, idle and while the
    /// calls wait.
    pub(crate) resumes: usize,
    pub(crate) passes: usize,
    pub(crate) settle: Duration,
    pub(crate) only: Option<String>,
    /// `MRTR_BENCH_TARGET`: parts of latency labels, joined by `|`.
    pub(crate) target: Option<String>,
    /// How long a run on an exporting proxy is followed before its CPU is read: its spans'
    /// export (every 500 ms) is counted with it, not with the next target's run.
    pub(crate) export_settle: Duration,
    pub(crate) out: Option<PathBuf>,
}

impl Plan {
    fn from_env() -> Self {
        let smoke = std::env::var_os("MRTR_BENCH_SMOKE").is_some();
        // 10 000 parked calls need two upstream connections each in the proxy: keep under the
        // open-file limit (the proxy inherits this process's).
        let fd_room = (peers::nofile_limit().saturating_sub(400) / 2) as usize;
        // Only a whole, unwrapped run rewrites the doc's tables: a part of one, or a profiled
        // one, would leave them a single row under a tool (it happened).
        let partial = [
            "MRTR_BENCH_ONLY",
            "MRTR_BENCH_TARGET",
            "MRTR_BENCH_PROXY_WRAPPER",
            "MRTR_BENCH_TRACING_WRAPPER",
        ]
        .iter()
        .any(|v| std::env::var_os(v).is_some());
        let out = std::env::var_os("MRTR_BENCH_OUT")
            .map(PathBuf::from)
            .or_else(|| {
                (!smoke && !partial)
                    .then(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/BENCHMARKS.md"))
            });
        let only = std::env::var("MRTR_BENCH_ONLY").ok();
        let target = std::env::var("MRTR_BENCH_TARGET").ok();
        if smoke {
            return Self {
                smoke,
                rounds: 2,
                warmup: 5,
                iterations: 20,
                throughput_time: Duration::from_millis(200),
                levels: vec![1, 10],
                level_time: Duration::from_millis(200),
                parked: 200.min(fd_room),
                parked_ttl: Duration::from_secs(2),
                resumes: 10,
                passes: 20,
                settle: Duration::from_secs(1),
                only,
                target,
                export_settle: Duration::ZERO,
                out,
            };
        }
        Self {
            smoke,
            rounds: 6,
            warmup: 50,
            iterations: 400,
            throughput_time: Duration::from_secs(2),
            levels: vec![1, 10, 100, 1000],
            level_time: Duration::from_secs(3),
            parked: 10_000.min(fd_room),
            parked_ttl: Duration::from_secs(30),
            resumes: 200,
            passes: 400,
            settle: Duration::from_secs(15),
            only,
            target,
            export_settle: Duration::from_millis(700),
            out,
        }
    }

    pub(crate) fn runs(&self, phase: &str) -> bool {
        self.only.as_deref().is_none_or(|o| o == phase)
    }

    /// Whether the latency target `label` is timed (`MRTR_BENCH_TARGET` names a part of it).
    pub(crate) fn times(&self, label: &str) -> bool {
        self.target
            .as_deref()
            .is_none_or(|t| t.split('|').any(|part| label.contains(part)))
    }

    // Whether this run needs the proxies that export traces.
    fn traces(&self) -> bool {
        self.runs("throughput")
            || (self.runs("latency") && report::TRACING.iter().any(|(l, _)| self.times(l)))
    }
}

/// The three ways to the upstream, the processes behind them, and the proxies that export
/// traces (when this run measures them).
pub(crate) struct Targets {
    pub(crate) upstream: Server,
    pub(crate) nginx: Option<Server>,
    pub(crate) proxy: Server,
    pub(crate) traced: Option<traces::Traced>,
}

impl Targets {
    pub(crate) fn direct(&self) -> Endpoint {
        Endpoint::parse(&self.upstream.url)
    }
    pub(crate) fn nginx(&self) -> Option<Endpoint> {
        self.nginx.as_ref().map(|n| Endpoint::parse(&n.url))
    }
    pub(crate) fn proxy(&self) -> Endpoint {
        Endpoint::parse(&self.proxy.url)
    }
}

/// The proxy's configuration for the benchmark: its defaults (the gather window included), with
/// the bounds opened up for `parked` calls and 1000 concurrent ones.
pub(crate) fn proxy_config(parked: usize, ttl: Duration) -> String {
    let sessions = parked.max(1000) + 64;
    format!(
        "[server]\nmax_connections = 8192\nmax_requests_per_principal = 100000\n\
         [pool]\nmax_sessions = {sessions}\n\
         [state]\nttl = \"{ttl}s\"\nmax_parked = {sessions}\nmax_parked_per_principal = {sessions}\n\
         max_parked_memory = \"2GiB\"\n",
        ttl = ttl.as_secs().max(1),
    )
}

fn main() {
    if std::env::var(ROLE).as_deref() == Ok("upstream") {
        return peers::serve_upstream();
    }
    let plan = Plan::from_env();
    // Before the runtime starts a thread: every thread of the load generator inherits CPU 1.
    peers::pin_self();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run(plan));
}

async fn run(plan: Plan) {
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("mrtr-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench dir");
    let mut report = Report::new(&plan);
    {
        let upstream = peers::start_upstream();
        let nginx = peers::nginx_binary().map(|b| peers::start_nginx(&b, &upstream.url, &dir));
        if nginx.is_none() {
            println!("nginx not found: the nginx columns stay empty (apt-get install nginx-light)");
        }
        let config = proxy_config(1000, Duration::from_secs(300));
        let proxy = peers::start_proxy(&upstream.url, &config, &dir);
        let traced = if plan.traces() {
            Some(traces::Traced::start(&upstream.url, &config, &dir).await)
        } else {
            None
        };
        let t = Targets {
            upstream,
            nginx,
            proxy,
            traced,
        };
        if plan.runs("latency") {
            phases::latency(&plan, &t, &mut report).await;
        }
        if plan.runs("throughput") {
            phases::throughput(&plan, &t, &mut report).await;
        }
        if plan.runs("concurrency") {
            phases::concurrency(&plan, &t, &mut report).await;
        }
    }
    if plan.runs("capacity") {
        capacity::run(&plan, &dir, &mut report).await;
    }
    phases::token(&plan, &mut report);
    let _ = std::fs::remove_dir_all(&dir);
    report.finish(started.elapsed());
}
