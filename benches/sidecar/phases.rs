//! The phases of a run: latency, throughput, concurrency, capacity, token.

use std::path::Path;
use std::time::{Duration, Instant};

use mrtr_proxy::benching::TokenBench;

use super::load::{self, median, quantile, shuffled};
use super::peers;
use super::report::{self, Capacity, Report};
use super::wire::{Client, Endpoint, Exchange};
use super::{proxy_config, Plan, Targets};

// Per-run bound on exchanges per worker (the run's time bounds it first).
const MAX_EACH: usize = 1_000_000;

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

// A legacy session opened on `ep`.
async fn session(ep: &Endpoint) -> String {
    Client::open(ep, Exchange::LegacyCall, None)
        .await
        .initialize()
        .await
}

/// A latency target: label, endpoint, exchange, legacy session, and the process in the middle
/// whose CPU is read.
type Target = (
    &'static str,
    Endpoint,
    Exchange,
    Option<String>,
    Option<u32>,
);

/// Sequential latency of every target, interleaved in a random order per iteration.
pub(crate) async fn latency(plan: &Plan, t: &Targets, report: &mut Report) {
    let mut targets: Vec<Target> = Vec::new();
    let direct = t.direct();
    let proxy = t.proxy();
    let proxy_pid = Some(t.proxy.pid());
    let s = session(&direct).await;
    targets.push((
        report::DIRECT_CALL,
        direct.clone(),
        Exchange::LegacyCall,
        Some(s.clone()),
        None,
    ));
    targets.push((
        report::DIRECT_ROUND,
        direct,
        Exchange::LegacyRound,
        Some(s),
        None,
    ));
    if let (Some(nginx), Some(server)) = (t.nginx(), t.nginx.as_ref()) {
        let s = session(&nginx).await;
        let pid = Some(server.pid());
        targets.push((
            report::NGINX_CALL,
            nginx.clone(),
            Exchange::LegacyCall,
            Some(s.clone()),
            pid,
        ));
        targets.push((
            report::NGINX_ROUND,
            nginx,
            Exchange::LegacyRound,
            Some(s),
            pid,
        ));
    }
    let s = session(&proxy).await;
    targets.push((
        report::PROXY_LEGACY_CALL,
        proxy.clone(),
        Exchange::LegacyCall,
        Some(s),
        proxy_pid,
    ));
    targets.push((
        report::PROXY_MODERN_CALL,
        proxy.clone(),
        Exchange::ModernCall,
        None,
        proxy_pid,
    ));
    targets.push((
        report::PROXY_ROUND,
        proxy,
        Exchange::MrtrRound,
        None,
        proxy_pid,
    ));
    // `MRTR_BENCH_TARGET=modern` (a part of a label) times only the targets it names: a
    // profile of one path.
    if let Ok(only) = std::env::var("MRTR_BENCH_TARGET") {
        targets.retain(|(label, ..)| label.contains(only.as_str()));
    }
    let mut clients = Vec::new();
    for (label, ep, ex, s, pid) in targets {
        clients.push(Timed {
            label,
            ex,
            client: Client::open(&ep, ex, s).await,
            pid,
            p50s: Vec::new(),
            p99s: Vec::new(),
            cpu: Vec::new(),
        });
    }
    for round in 0..plan.rounds {
        let order = shuffled((0..clients.len()).collect::<Vec<_>>());
        for i in order {
            let c = &mut clients[i];
            // CPU time of the process in the middle (all its threads, kernel included) over
            // the whole run, warm-up too, per exchange.
            let cpu_before = c.pid.map(peers::cpu_ns);
            let lat = load::sequential(&mut c.client, c.ex, plan.warmup, plan.iterations).await;
            if let (Some(pid), Some(before)) = (c.pid, cpu_before) {
                let n = (plan.warmup + plan.iterations) as f64;
                c.cpu
                    .push(peers::cpu_ns(pid).saturating_sub(before) as f64 / 1000.0 / n);
            }
            c.p50s.push(us(quantile(&lat, 0.5)));
            c.p99s.push(us(quantile(&lat, 0.99)));
        }
        println!("latency: iteration {} of {} done", round + 1, plan.rounds);
    }
    for c in clients {
        let cpu = (!c.cpu.is_empty()).then(|| median(c.cpu));
        report.latency(c.label, median(c.p50s), median(c.p99s), cpu);
    }
}

/// One latency target: its client, and what each iteration measured.
struct Timed {
    label: &'static str,
    ex: Exchange,
    client: Client,
    pid: Option<u32>,
    p50s: Vec<f64>,
    p99s: Vec<f64>,
    /// µs of CPU of the process in the middle per exchange.
    cpu: Vec<f64>,
}

/// Requests per second at 32 connections, interleaved like latency.
pub(crate) async fn throughput(plan: &Plan, t: &Targets, report: &mut Report) {
    const CONNS: usize = 32;
    let direct = t.direct();
    let proxy = t.proxy();
    let mut targets: Vec<(&'static str, Exchange, Vec<Client>, Vec<f64>)> = Vec::new();
    let s = session(&direct).await;
    let ex = Exchange::LegacyCall;
    targets.push((
        report::DIRECT_CALL,
        ex,
        load::clients(&direct, ex, Some(&s), CONNS).await,
        vec![],
    ));
    if let Some(nginx) = t.nginx() {
        let s = session(&nginx).await;
        targets.push((
            report::NGINX_CALL,
            ex,
            load::clients(&nginx, ex, Some(&s), CONNS).await,
            vec![],
        ));
    }
    let s = session(&proxy).await;
    targets.push((
        report::PROXY_LEGACY_CALL,
        ex,
        load::clients(&proxy, ex, Some(&s), CONNS).await,
        vec![],
    ));
    let m = Exchange::ModernCall;
    targets.push((
        report::PROXY_MODERN_CALL,
        m,
        load::clients(&proxy, m, None, CONNS).await,
        vec![],
    ));
    for round in 0..plan.rounds.div_ceil(2) {
        for i in shuffled((0..targets.len()).collect::<Vec<_>>()) {
            let (_, ex, clients, rates) = &mut targets[i];
            let (run, back) =
                load::concurrent(std::mem::take(clients), *ex, plan.throughput_time, MAX_EACH)
                    .await;
            *clients = back;
            rates.push(run.rate());
        }
        println!("throughput: iteration {} done", round + 1);
    }
    for (label, _, _, rates) in targets {
        report.throughput(label, median(rates));
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

/// `plan.parked` calls parked at once on a fresh proxy: its memory per call, and after expiry.
pub(crate) async fn capacity(plan: &Plan, dir: &Path, report: &mut Report) {
    const WORKERS: usize = 64;
    let upstream = peers::start_upstream();
    let config = proxy_config(plan.parked, plan.parked_ttl);
    let proxy = peers::start_proxy(&upstream.url, &config, dir);
    let ep = Endpoint::parse(&proxy.url);
    let clients = load::clients(&ep, Exchange::MrtrRound, None, WORKERS).await;
    // Warm: every worker completes rounds (sessions pooled, allocator warmed), nothing parked.
    let clients = load::each(clients, Exchange::MrtrRound, 4).await;
    let base = peers::rss_kib(proxy.pid());
    let start = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            let n = plan.parked / WORKERS + usize::from(i < plan.parked % WORKERS);
            tokio::spawn(async move {
                for _ in 0..n {
                    c.park().await;
                }
                c
            })
        })
        .collect();
    let mut clients = Vec::new();
    for t in tasks {
        clients.push(t.await.expect("parking worker"));
    }
    let parking = start.elapsed();
    let peak = peers::rss_kib(proxy.pid());
    let fds = peers::fds(proxy.pid());
    println!(
        "capacity: {} parked in {:.1} s, RSS {base} -> {peak} KiB",
        plan.parked,
        parking.as_secs_f64()
    );
    let mut metrics = clients.pop().expect("a client");
    let until = Instant::now() + plan.parked_ttl + Duration::from_secs(90);
    loop {
        let text = metrics.get_text("/metrics").await;
        if text.contains("mrtr_parked_calls 0\n") {
            break;
        }
        assert!(
            Instant::now() < until,
            "parked calls did not expire:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(clients);
    drop(metrics);
    tokio::time::sleep(plan.settle).await;
    let after = peers::rss_kib(proxy.pid());
    report.capacity(Capacity {
        parked: plan.parked,
        base_kib: base,
        peak_kib: peak,
        after_kib: after,
        fds,
        settle: plan.settle,
    });
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
