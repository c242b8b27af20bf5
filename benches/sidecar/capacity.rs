//! The capacity phase (issue 26): `plan.parked` calls parked at once on a fresh proxy. Its
//! memory per parked call and after they expired, and how a resume (the retry → its result) and
//! a legacy pass-through `tools/call` fare while they wait, against the same proxy idle.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use super::load::{self, quantile};
use super::peers;
use super::phases::session;
use super::report::Report;
use super::wire::{Client, Endpoint, Exchange};
use super::{proxy_config, Plan};

// Connections that park the calls.
const WORKERS: usize = 64;
// Untimed exchanges of each kind before a measurement (the probe's connections may have been
// closed while they sat idle).
const WARMUP: usize = 10;
// Bound on the idle measurement (the loaded one is bounded by the calls' expiry).
const IDLE_TIME: Duration = Duration::from_secs(60);
// The target count of issue 26, and the bounds on memory and on the latencies while they wait.
const TARGET_PARKED: usize = 10_000;
const TARGET_KIB: f64 = 32.0;
const TARGET_RESUME_P99: f64 = 2.0;
const TARGET_PASS: f64 = 1.2;
const UNCHANGED: &str = " (\"unchanged\")";

// A bound on the loaded / idle ratio, and what it is called.
type Bound = Option<(f64, &'static str)>;

/// p50 and p99 of one kind of exchange in one measurement, and how many were timed.
#[derive(Clone, Copy, Default)]
pub(crate) struct Quantiles {
    n: usize,
    p50: Duration,
    p99: Duration,
}

impl Quantiles {
    fn of(mut lat: Vec<Duration>) -> Self {
        lat.sort();
        Self {
            n: lat.len(),
            p50: quantile(&lat, 0.5),
            p99: quantile(&lat, 0.99),
        }
    }
}

/// Resumes and pass-through calls timed on one proxy, idle or with the calls parked.
#[derive(Clone, Copy, Default)]
pub(crate) struct Waits {
    resume: Quantiles,
    pass: Quantiles,
}

/// What the capacity phase measured.
pub(crate) struct Capacity {
    parked: usize,
    /// This process's open-file limit, which capped `parked`.
    nofile: u64,
    base_kib: u64,
    peak_kib: u64,
    after_kib: u64,
    fds: usize,
    settle: Duration,
    parking: Duration,
    idle: Waits,
    loaded: Waits,
    /// Idle again, after they expired.
    again: Waits,
    /// Parked calls (the proxy's gauge) once the loaded measurement ended.
    still_parked: Option<usize>,
}

/// The two probes, each on keep-alive connections of its own: MRTR rounds whose retry is timed,
/// and legacy `tools/call`s relayed in a legacy session of their own.
struct Probe {
    mrtr: Client,
    legacy: Client,
}

impl Probe {
    async fn open(ep: &Endpoint) -> Self {
        let s = session(ep).await;
        Self {
            mrtr: Client::open(ep, Exchange::MrtrRound, None).await,
            legacy: Client::open(ep, Exchange::LegacyCall, Some(s)).await,
        }
    }

    // One call parked (untimed), then its retry timed to the result.
    async fn resume(&mut self) -> Duration {
        let state = self.mrtr.park().await;
        let t = Instant::now();
        self.mrtr.resume(&state).await;
        t.elapsed()
    }

    async fn pass(&mut self) -> Duration {
        let t = Instant::now();
        self.legacy.run(Exchange::LegacyCall).await;
        t.elapsed()
    }

    // `plan.resumes` resumes and `plan.passes` pass-through calls, one at a time, interleaved
    // evenly; none started after `until`.
    async fn measure(&mut self, plan: &Plan, until: Instant) -> Waits {
        for _ in 0..WARMUP {
            self.resume().await;
            self.pass().await;
        }
        let (k, m) = (plan.resumes, plan.passes);
        let steps = k.max(m).max(1);
        // Whether step `i` of `steps` runs one of `n` spread evenly.
        let due = |i: usize, n: usize| (i + 1) * n / steps > i * n / steps;
        let (mut resumes, mut passes) = (Vec::with_capacity(k), Vec::with_capacity(m));
        for i in 0..steps {
            if Instant::now() >= until {
                break;
            }
            if due(i, m) {
                passes.push(self.pass().await);
            }
            if due(i, k) {
                resumes.push(self.resume().await);
            }
        }
        Waits {
            resume: Quantiles::of(resumes),
            pass: Quantiles::of(passes),
        }
    }
}

// Every client parks its share of `n` calls, all at once; returns the clients.
async fn park(clients: Vec<Client>, n: usize) -> Vec<Client> {
    let workers = clients.len().max(1);
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            let each = n / workers + usize::from(i < n % workers);
            tokio::spawn(async move {
                for _ in 0..each {
                    c.park().await;
                }
                c
            })
        })
        .collect();
    let mut back = Vec::with_capacity(workers);
    for t in tasks {
        back.push(t.await.expect("parking worker"));
    }
    back
}

// The proxy's parked-calls gauge.
async fn parked_now(metrics: &mut Client) -> Option<usize> {
    let text = metrics.get_text("/metrics").await;
    text.lines()
        .find_map(|l| l.strip_prefix("mrtr_parked_calls ")?.trim().parse().ok())
}

// Waits (bounded) until no call is parked any more.
async fn expired(metrics: &mut Client, ttl: Duration) {
    let until = Instant::now() + ttl + Duration::from_secs(90);
    while parked_now(metrics).await != Some(0) {
        assert!(Instant::now() < until, "parked calls did not expire");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `plan.parked` calls parked at once on a fresh proxy: its memory per call, and after expiry;
/// resumes and pass-through calls timed on it idle and while the calls wait.
pub(crate) async fn run(plan: &Plan, dir: &Path, report: &mut Report) {
    let upstream = peers::start_upstream();
    let config = proxy_config(plan.parked, plan.parked_ttl);
    let proxy = peers::start_proxy(&upstream.url, &config, dir);
    let ep = Endpoint::parse(&proxy.url);
    let clients = load::clients(&ep, Exchange::MrtrRound, None, WORKERS).await;
    // Warm: every worker completes rounds (sessions pooled, allocator warmed), nothing parked.
    let clients = load::each(clients, Exchange::MrtrRound, 4).await;
    let mut probe = Probe::open(&ep).await;
    let idle = probe.measure(plan, Instant::now() + IDLE_TIME).await;
    let base = peers::rss_kib(proxy.pid());
    let start = Instant::now();
    let mut clients = park(clients, plan.parked).await;
    let parking = start.elapsed();
    let peak = peers::rss_kib(proxy.pid());
    let fds = peers::fds(proxy.pid());
    println!(
        "capacity: {} parked in {:.1} s, RSS {base} -> {peak} KiB",
        plan.parked,
        parking.as_secs_f64()
    );
    // Halfway from now to the first call's expiry: every timed exchange runs while they wait.
    let first_expiry = start + plan.parked_ttl;
    let until = Instant::now() + first_expiry.saturating_duration_since(Instant::now()) / 2;
    let loaded = probe.measure(plan, until).await;
    let mut metrics = clients.pop().expect("a client");
    let still_parked = parked_now(&mut metrics).await;
    expired(&mut metrics, plan.parked_ttl).await;
    drop((clients, metrics));
    tokio::time::sleep(plan.settle).await;
    let after_kib = peers::rss_kib(proxy.pid());
    // Idle again: what the same proxy does once warm (the first idle figure comes from a proxy
    // that had served little yet).
    let again = probe.measure(plan, Instant::now() + IDLE_TIME).await;
    report.capacity(Capacity {
        parked: plan.parked,
        nofile: peers::nofile_limit(),
        base_kib: base,
        peak_kib: peak,
        after_kib,
        fds,
        settle: plan.settle,
        parking,
        idle,
        loaded,
        again,
        still_parked,
    });
}

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "missed"
    }
}

impl Capacity {
    fn per_call_kib(&self) -> f64 {
        self.peak_kib.saturating_sub(self.base_kib) as f64 / self.parked.max(1) as f64
    }

    // The count against the target, and what capped it.
    fn count(&self) -> String {
        let room = self.nofile.saturating_sub(400) / 2;
        if self.parked >= TARGET_PARKED {
            format!("{} (target {TARGET_PARKED}: reached)", self.parked)
        } else if room <= self.parked as u64 {
            format!(
                "{}, target {TARGET_PARKED}: not reached — the open-file limit here ({}) holds \
                 ({} − 400) / 2 = {room} (two upstream connections each); {TARGET_PARKED} needs a \
                 limit above {}",
                self.parked,
                self.nofile,
                self.nofile,
                2 * TARGET_PARKED + 400,
            )
        } else {
            format!("{} (a smaller run; target {TARGET_PARKED})", self.parked)
        }
    }

    // One latency row: idle, loaded, idle again; loaded / idle and the bound on it (if any).
    fn row(t: &mut String, what: &str, [idle, loaded, again]: [Duration; 3], bound: Bound) {
        let ratio = loaded.as_secs_f64() / idle.as_secs_f64().max(1e-9);
        let (goal, met) = match bound {
            Some((x, says)) => (format!("≤ {x}×{says}"), verdict(ratio <= x)),
            None => ("–".into(), ""),
        };
        let _ = writeln!(
            t,
            "| {what} | {} | {} | {} | {ratio:.2}× | {goal} | {met} |",
            us(idle),
            us(loaded),
            us(again),
        );
    }

    // The latency rows: resume and pass-through, p50 and p99.
    fn rows(&self, t: &mut String) {
        let waits = [self.idle, self.loaded, self.again];
        let three = |pick: fn(&Waits) -> Duration| waits.map(|w| pick(&w));
        let (resume, pass) = (
            Some((TARGET_RESUME_P99, "")),
            Some((TARGET_PASS, UNCHANGED)),
        );
        let rows: [(&str, [Duration; 3], Bound); 4] = [
            (
                "resume (retry → result), p50",
                three(|w| w.resume.p50),
                None,
            ),
            (
                "resume (retry → result), p99",
                three(|w| w.resume.p99),
                resume,
            ),
            (
                "legacy pass-through tools/call, p50",
                three(|w| w.pass.p50),
                pass,
            ),
            (
                "legacy pass-through tools/call, p99",
                three(|w| w.pass.p99),
                pass,
            ),
        ];
        for (what, figures, bound) in rows {
            Self::row(t, what, figures, bound);
        }
    }

    /// The report's capacity section: the count, the table against issue 26's targets, and how
    /// it was measured.
    pub(crate) fn section(&self) -> String {
        let (i, l, a) = (self.idle, self.loaded, self.again);
        let kib = self.per_call_kib();
        let mut t = format!(
            "Calls parked at once on a fresh proxy: {}.\n\n\
             | with the calls parked | idle (nothing parked yet) | {} parked | idle again (after they expired) | loaded / idle | target | |\n\
             |---|---|---|---|---|---|---|\n\
             | proxy RSS per parked call | – | {kib:.1} KiB | – | – | ≤ {TARGET_KIB} KiB | {} |\n",
            self.count(),
            self.parked,
            verdict(kib <= TARGET_KIB),
        );
        self.rows(&mut t);
        let _ = write!(
            t,
            "\nResumes (a call parked, untimed, then its retry timed to the result) and relayed legacy calls (a legacy session of their own), one at a time, interleaved, each kind on a keep-alive connection of its own after {WARMUP} untimed: {} and {} idle, {} and {} while the calls waited (still parked at the end: {}), {} and {} idle again. \
             Proxy RSS {:.1} MB before, {:.1} MB parked ({} fds; parking took {:.1} s), {:.1} MB {} s after they expired.",
            i.resume.n,
            i.pass.n,
            l.resume.n,
            l.pass.n,
            self.still_parked.map_or("unknown".into(), |n| n.to_string()),
            a.resume.n,
            a.pass.n,
            self.base_kib as f64 / 1024.0,
            self.peak_kib as f64 / 1024.0,
            self.fds,
            self.parking.as_secs_f64(),
            self.after_kib as f64 / 1024.0,
            self.settle.as_secs(),
        );
        t
    }
}
