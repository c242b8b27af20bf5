//! The phases of a run: latency, throughput, concurrency, token (capacity: `capacity`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use mrtr_proxy::benching::TokenBench;

use super::load::{self, median, quantile, shuffled};
use super::peers;
use super::report::{self, Report};
use super::traces::{Counts, Exported, Traced};
use super::wire::{Client, Endpoint, Exchange};
use super::{Plan, Targets};

// Per-run bound on exchanges per worker (the run's time bounds it first).
const MAX_EACH: usize = 1_000_000;
// Connections of the throughput phase.
const CONNS: usize = 32;

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// A legacy session opened on `ep`.
pub(crate) async fn session(ep: &Endpoint) -> String {
    Client::open(ep, Exchange::LegacyCall, None)
        .await
        .initialize()
        .await
}

/// A latency target: what is timed, where, and what is read around it.
pub(crate) struct Target {
    pub(crate) label: &'static str,
    pub(crate) ep: Endpoint,
    pub(crate) ex: Exchange,
    /// The legacy session to call in.
    pub(crate) session: Option<String>,
    /// The process in the middle, whose CPU is read.
    pub(crate) pid: Option<u32>,
    /// Whether that process exports traces: its runs are followed by `Plan::export_settle`.
    pub(crate) exports: bool,
    /// The sink it exports to, whose counters are read around its runs.
    pub(crate) sink: Option<Arc<Counts>>,
}

impl Target {
    fn new(label: &'static str, ep: &Endpoint, ex: Exchange, session: Option<&str>) -> Self {
        Self {
            label,
            ep: ep.clone(),
            ex,
            session: session.map(str::to_owned),
            pid: None,
            exports: false,
            sink: None,
        }
    }

    fn in_middle(self, pid: u32) -> Self {
        Self {
            pid: Some(pid),
            ..self
        }
    }
}

// The direct, nginx and proxy targets (the exporting proxies' come from `traces`).
async fn latency_targets(t: &Targets) -> Vec<Target> {
    use Exchange::{LegacyCall, LegacyRound, ModernCall, MrtrRound};
    let direct = t.direct();
    let s = session(&direct).await;
    let mut out = vec![
        Target::new(report::DIRECT_CALL, &direct, LegacyCall, Some(&s)),
        Target::new(report::DIRECT_ROUND, &direct, LegacyRound, Some(&s)),
    ];
    if let (Some(nginx), Some(server)) = (t.nginx(), t.nginx.as_ref()) {
        let s = session(&nginx).await;
        let pid = server.pid();
        out.push(Target::new(report::NGINX_CALL, &nginx, LegacyCall, Some(&s)).in_middle(pid));
        out.push(Target::new(report::NGINX_ROUND, &nginx, LegacyRound, Some(&s)).in_middle(pid));
    }
    let proxy = t.proxy();
    let pid = t.proxy.pid();
    let s = session(&proxy).await;
    for (label, ex, s) in [
        (report::PROXY_LEGACY_CALL, LegacyCall, Some(s.as_str())),
        (report::PROXY_MODERN_CALL, ModernCall, None),
        (report::PROXY_ROUND, MrtrRound, None),
    ] {
        out.push(Target::new(label, &proxy, ex, s).in_middle(pid));
    }
    out
}

/// Sequential latency of every target, interleaved in a random order per iteration.
pub(crate) async fn latency(plan: &Plan, t: &Targets, report: &mut Report) {
    let mut targets = latency_targets(t).await;
    targets.extend(t.traced.iter().flat_map(Traced::latency_targets));
    // `MRTR_BENCH_TARGET=modern` (a part of a label) times only the targets it names: a
    // profile of one path.
    targets.retain(|target| plan.times(target.label));
    let mut clients = Vec::new();
    for target in targets {
        let client = Client::open(&target.ep, target.ex, target.session.clone()).await;
        clients.push(Timed {
            target,
            client,
            p50s: Vec::new(),
            p99s: Vec::new(),
            cpu: Vec::new(),
            exported: Exported::default(),
        });
    }
    for round in 0..plan.rounds {
        let order = shuffled((0..clients.len()).collect::<Vec<_>>());
        for i in order {
            time(plan, &mut clients[i]).await;
        }
        println!("latency: iteration {} of {} done", round + 1, plan.rounds);
    }
    if let Some(traced) = t
        .traced
        .as_ref()
        .filter(|_| clients.iter().any(|c| c.target.sink.is_some()))
    {
        report.sink(traced.check().await);
    }
    let per_run = (plan.rounds * (plan.warmup + plan.iterations)) as f64;
    for c in clients {
        let cpu = (!c.cpu.is_empty()).then(|| median(c.cpu));
        let label = c.target.label;
        report.latency(label, median(c.p50s), median(c.p99s), cpu);
        // Without the settle (a smoke run) the spans are not all in yet.
        if c.target.sink.is_some() && !plan.export_settle.is_zero() {
            report.exported(
                label,
                c.exported.spans as f64 / per_run,
                c.exported.bytes as f64 / per_run,
            );
        }
    }
}

// One run of one target: its latencies, and the CPU of the process in the middle (all its
// threads, kernel included) over the whole run, warm-up too, per exchange; on an exporting
// proxy, until its spans have been exported.
async fn time(plan: &Plan, c: &mut Timed) {
    let cpu_before = c.target.pid.map(peers::cpu_ns);
    let sent_before = c.target.sink.as_ref().map(|s| s.now());
    let lat = load::sequential(&mut c.client, c.target.ex, plan.warmup, plan.iterations).await;
    if c.target.exports {
        tokio::time::sleep(plan.export_settle).await;
    }
    if let (Some(pid), Some(before)) = (c.target.pid, cpu_before) {
        let n = (plan.warmup + plan.iterations) as f64;
        c.cpu
            .push(peers::cpu_ns(pid).saturating_sub(before) as f64 / 1000.0 / n);
    }
    if let (Some(sink), Some(before)) = (&c.target.sink, sent_before) {
        c.exported = c.exported.plus(sink.now().since(before));
    }
    c.p50s.push(us(quantile(&lat, 0.5)));
    c.p99s.push(us(quantile(&lat, 0.99)));
}

/// One latency target: its client, and what each iteration measured.
struct Timed {
    target: Target,
    client: Client,
    p50s: Vec<f64>,
    p99s: Vec<f64>,
    /// µs of CPU of the process in the middle per exchange.
    cpu: Vec<f64>,
    /// What its proxy exported over all its runs.
    exported: Exported,
}

/// A throughput target: its connections, whether its proxy exports traces, and the rate of
/// each iteration.
struct Loaded {
    label: &'static str,
    ex: Exchange,
    clients: Vec<Client>,
    exports: bool,
    rates: Vec<f64>,
}

impl Loaded {
    async fn open(
        label: &'static str,
        (ep, ex): (&Endpoint, Exchange),
        session: Option<&str>,
        exports: bool,
    ) -> Self {
        Self {
            label,
            ex,
            clients: load::clients(ep, ex, session, CONNS).await,
            exports,
            rates: Vec::new(),
        }
    }
}

// The direct, nginx and proxy targets, and the exporting proxies' modern call (sink; hung).
async fn throughput_targets(t: &Targets) -> Vec<Loaded> {
    let (call, modern) = (Exchange::LegacyCall, Exchange::ModernCall);
    let direct = t.direct();
    let s = session(&direct).await;
    let mut out = vec![Loaded::open(report::DIRECT_CALL, (&direct, call), Some(&s), false).await];
    if let Some(nginx) = t.nginx() {
        let s = session(&nginx).await;
        out.push(Loaded::open(report::NGINX_CALL, (&nginx, call), Some(&s), false).await);
    }
    let proxy = t.proxy();
    let s = session(&proxy).await;
    out.push(Loaded::open(report::PROXY_LEGACY_CALL, (&proxy, call), Some(&s), false).await);
    out.push(Loaded::open(report::PROXY_MODERN_CALL, (&proxy, modern), None, false).await);
    if let Some(traced) = &t.traced {
        for (label, server) in [
            (report::TRACED_CALL, &traced.on),
            (report::HUNG_CALL, &traced.hung),
        ] {
            let ep = Endpoint::parse(&server.url);
            out.push(Loaded::open(label, (&ep, modern), None, true).await);
        }
    }
    out
}

/// Requests per second at 32 connections, interleaved like latency.
pub(crate) async fn throughput(plan: &Plan, t: &Targets, report: &mut Report) {
    let mut targets = throughput_targets(t).await;
    for round in 0..plan.rounds.div_ceil(2) {
        for i in shuffled((0..targets.len()).collect::<Vec<_>>()) {
            let target = &mut targets[i];
            let clients = std::mem::take(&mut target.clients);
            let (run, back) =
                load::concurrent(clients, target.ex, plan.throughput_time, MAX_EACH).await;
            target.clients = back;
            target.rates.push(run.rate());
            // Its spans' export, which follows, is not the next target's load.
            if target.exports {
                tokio::time::sleep(plan.export_settle).await;
            }
        }
        println!("throughput: iteration {} done", round + 1);
    }
    for target in targets {
        report.throughput(target.label, median(target.rates));
    }
}

/// MRTR rounds through the proxy with 1, 10, 100, 1000 calls at once.
pub(crate) async fn concurrency(plan: &Plan, t: &Targets, report: &mut Report) {
    let proxy = t.proxy();
    for &level in &plan.levels {
        let clients = load::clients(&proxy, Exchange::MrtrRound, None, level).await;
        // One round each first: every worker's call has a session before the clock starts.
        let clients = load::each(clients, Exchange::MrtrRound, 1).await;
        let (run, _) =
            load::concurrent(clients, Exchange::MrtrRound, plan.level_time, MAX_EACH).await;
        let (p50, p99) = (
            quantile(&run.latencies, 0.5),
            quantile(&run.latencies, 0.99),
        );
        println!(
            "concurrency {level}: {:.0} rounds/s, p50 {:.2} ms, p99 {:.2} ms",
            run.rate(),
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3
        );
        report.concurrency(level, run.rate(), p50, p99);
    }
}

/// requestState sign + verify, timed here too (criterion has the careful figure:
/// `cargo bench --bench token`).
pub(crate) fn token(plan: &Plan, report: &mut Report) {
    let bench = TokenBench::new();
    let n = if plan.smoke { 1_000 } else { 50_000 };
    for _ in 0..n / 10 {
        bench.sign_and_verify();
    }
    let start = Instant::now();
    for _ in 0..n {
        std::hint::black_box(bench.sign_and_verify());
    }
    report.token(start.elapsed().as_secs_f64() * 1e6 / n as f64);
}
