//! The run's figures: printed as a table, and written between the markers of
//! `docs/BENCHMARKS.md` with the machine, the command and the date.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::capacity::Capacity;
use super::traces::Exported;
use super::Plan;

pub(crate) const DIRECT_CALL: &str = "direct: legacy tools/call";
pub(crate) const NGINX_CALL: &str = "nginx: legacy tools/call";
pub(crate) const PROXY_LEGACY_CALL: &str = "mrtr-proxy: legacy tools/call (relayed)";
pub(crate) const PROXY_MODERN_CALL: &str = "mrtr-proxy: modern tools/call";
pub(crate) const DIRECT_ROUND: &str = "direct: legacy elicitation round";
pub(crate) const NGINX_ROUND: &str = "nginx: legacy elicitation round";
pub(crate) const PROXY_ROUND: &str = "mrtr-proxy: MRTR round";
pub(crate) const TRACED_CALL: &str = "mrtr-proxy, tracing on (sampled 1.0): modern tools/call";
pub(crate) const TRACED_ROUND: &str = "mrtr-proxy, tracing on (sampled 1.0): MRTR round";
pub(crate) const DOWN_CALL: &str = "mrtr-proxy, tracing on, collector down: modern tools/call";
pub(crate) const DOWN_ROUND: &str = "mrtr-proxy, tracing on, collector down: MRTR round";
pub(crate) const HUNG_CALL: &str = "mrtr-proxy, tracing on, collector hung: modern tools/call";
pub(crate) const HUNG_ROUND: &str = "mrtr-proxy, tracing on, collector hung: MRTR round";
/// The exporting proxies' targets, each with the same exchange on the proxy that does not export.
pub(crate) const TRACING: [(&str, &str); 6] = [
    (TRACED_CALL, PROXY_MODERN_CALL),
    (TRACED_ROUND, PROXY_ROUND),
    (DOWN_CALL, PROXY_MODERN_CALL),
    (DOWN_ROUND, PROXY_ROUND),
    (HUNG_CALL, PROXY_MODERN_CALL),
    (HUNG_ROUND, PROXY_ROUND),
];

const BEGIN: &str = "<!-- bench:begin (written by `cargo bench --bench sidecar`) -->";
const END: &str = "<!-- bench:end -->";

/// Everything measured in one run.
pub(crate) struct Report {
    smoke: bool,
    out: Option<PathBuf>,
    rounds: usize,
    iterations: usize,
    latency: BTreeMap<&'static str, (f64, f64)>,
    /// µs of CPU of the process in the middle per exchange.
    cpu: BTreeMap<&'static str, f64>,
    throughput: BTreeMap<&'static str, f64>,
    concurrency: Vec<(usize, f64, Duration, Duration)>,
    capacity: Option<Capacity>,
    token_us: f64,
    /// Spans and bytes exported per exchange, by target.
    exported: BTreeMap<&'static str, (f64, f64)>,
    /// Everything the sink received in the latency phase.
    sink: Option<Exported>,
}

impl Report {
    pub(crate) fn new(plan: &Plan) -> Self {
        Self {
            smoke: plan.smoke,
            out: plan.out.clone(),
            rounds: plan.rounds,
            iterations: plan.iterations,
            latency: BTreeMap::new(),
            cpu: BTreeMap::new(),
            throughput: BTreeMap::new(),
            concurrency: Vec::new(),
            capacity: None,
            token_us: 0.0,
            exported: BTreeMap::new(),
            sink: None,
        }
    }

    pub(crate) fn latency(
        &mut self,
        label: &'static str,
        p50_us: f64,
        p99_us: f64,
        cpu_us: Option<f64>,
    ) {
        self.latency.insert(label, (p50_us, p99_us));
        if let Some(c) = cpu_us {
            self.cpu.insert(label, c);
        }
    }

    pub(crate) fn throughput(&mut self, label: &'static str, rate: f64) {
        self.throughput.insert(label, rate);
    }

    pub(crate) fn concurrency(&mut self, level: usize, rate: f64, p50: Duration, p99: Duration) {
        self.concurrency.push((level, rate, p50, p99));
    }

    pub(crate) fn capacity(&mut self, c: Capacity) {
        self.capacity = Some(c);
    }

    pub(crate) fn token(&mut self, us: f64) {
        self.token_us = us;
    }

    pub(crate) fn exported(&mut self, label: &'static str, spans: f64, bytes: f64) {
        self.exported.insert(label, (spans, bytes));
    }

    pub(crate) fn sink(&mut self, got: Exported) {
        self.sink = Some(got);
    }

    // What exporting traces adds: each exporting target against the same exchange on the proxy
    // that does not export (empty when no exporting proxy was measured).
    fn tracing(&self) -> String {
        let us = |v: f64| format!("{v:+.1} µs");
        let mut rows = String::new();
        for (label, base) in TRACING {
            let Some((p50, p99)) = self.added(label, base) else {
                continue;
            };
            let cpu = self.cpu.get(label).zip(self.cpu.get(base));
            let cpu = cpu.map_or("–".into(), |(a, b)| us(a - b));
            let sent = self
                .exported
                .get(label)
                .map_or("–".into(), |(spans, bytes)| {
                    format!("{spans:.2} spans, {bytes:.0} B")
                });
            let _ = writeln!(
                rows,
                "| {label} | {} | {} | {cpu} | {sent} |",
                us(p50),
                us(p99)
            );
        }
        let mut t = String::new();
        if !rows.is_empty() {
            t.push_str("Trace export: the same proxy with `[telemetry]` (OTLP/HTTP to a sink in the harness, or to a dead collector); added: against the proxy without it, same method as above.\n\n\
                | target | p50 added | p99 added | CPU per exchange added | exported per exchange |\n|---|---|---|---|---|\n");
            t.push_str(&rows);
        }
        if let Some(s) = self.sink {
            let _ = writeln!(
                t,
                "\nThe sink received {} exports, {} spans, {} bytes in the latency phase.",
                s.requests, s.spans, s.bytes
            );
        }
        let rate = |l: &str| self.throughput.get(l).copied();
        for label in [TRACED_CALL, HUNG_CALL] {
            if let (Some(on), Some(off)) = (rate(label), rate(PROXY_MODERN_CALL)) {
                let _ = writeln!(t, "\nThroughput at 32 connections, {label}: {on:.0} req/s against {off:.0} without export ({:.2}×).", on / off.max(1e-9));
            }
        }
        t
    }

    // (what is added over the direct path, p50 and p99) of `label` against `base`.
    fn added(&self, label: &str, base: &str) -> Option<(f64, f64)> {
        let (a50, a99) = self.latency.get(label)?;
        let (b50, b99) = self.latency.get(base)?;
        Some((a50 - b50, a99 - b99))
    }

    fn targets(&self) -> String {
        let mut t = String::from(
            "| what | nginx | mrtr-proxy | ratio | target | |\n|---|---|---|---|---|---|\n",
        );
        let nginx_call = self.added(NGINX_CALL, DIRECT_CALL);
        let proxy_call = self.added(PROXY_LEGACY_CALL, DIRECT_CALL);
        let modern = self.added(PROXY_MODERN_CALL, DIRECT_CALL);
        let rounds = (
            self.added(NGINX_ROUND, DIRECT_ROUND),
            self.added(PROXY_ROUND, DIRECT_ROUND),
        );
        let us = |v: f64| format!("{v:+.0} µs");
        let mut row = |what: &str,
                       n: Option<f64>,
                       p: Option<f64>,
                       target: f64,
                       fmt: &dyn Fn(f64) -> String,
                       lower: bool| {
            let (ns, ps) = (n.map_or("–".into(), fmt), p.map_or("–".into(), fmt));
            let ratio = n.zip(p).map(|(n, p)| p / n.max(1e-9));
            let met = ratio.map_or("–", |r| {
                if (lower && r <= target) || (!lower && r >= target) {
                    "met"
                } else {
                    "missed"
                }
            });
            let rs = ratio.map_or("–".into(), |r| format!("{r:.2}×"));
            let cmp = if lower { "≤" } else { "≥" };
            let _ = writeln!(
                t,
                "| {what} | {ns} | {ps} | {rs} | {cmp} {target}× | {met} |"
            );
        };
        row(
            "legacy pass-through, added p50",
            nginx_call.map(|v| v.0),
            proxy_call.map(|v| v.0),
            1.0,
            &us,
            true,
        );
        row(
            "legacy pass-through, added p99",
            nginx_call.map(|v| v.1),
            proxy_call.map(|v| v.1),
            1.0,
            &us,
            true,
        );
        row(
            "modern tools/call vs the direct legacy call, added p50 (nginx: its hop)",
            nginx_call.map(|v| v.0),
            modern.map(|v| v.0),
            1.5,
            &us,
            true,
        );
        row(
            "one elicitation round (legacy round vs MRTR round), added p50",
            rounds.0.map(|v| v.0),
            rounds.1.map(|v| v.0),
            1.0,
            &us,
            true,
        );
        let rps = |v: f64| format!("{:.1}k req/s", v / 1000.0);
        let nginx_rate = self.throughput.get(NGINX_CALL).copied();
        row(
            "throughput at 32 connections, legacy",
            nginx_rate,
            self.throughput.get(PROXY_LEGACY_CALL).copied(),
            1.0,
            &rps,
            false,
        );
        row(
            "throughput at 32 connections, modern (vs nginx legacy)",
            nginx_rate,
            self.throughput.get(PROXY_MODERN_CALL).copied(),
            1.0,
            &rps,
            false,
        );
        t
    }

    fn details(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(t, "Sequential latency, one keep-alive connection (median over {} iterations of {} exchanges each):\n", self.rounds, self.iterations);
        t.push_str("| target | p50 | p99 | CPU per exchange of the process in the middle (all threads, kernel included) |\n|---|---|---|---|\n");
        for (label, (p50, p99)) in &self.latency {
            let cpu = self
                .cpu
                .get(label)
                .map_or("–".into(), |c| format!("{c:.1} µs"));
            let _ = writeln!(t, "| {label} | {p50:.0} µs | {p99:.0} µs | {cpu} |");
        }
        t.push_str("\nThroughput, 32 connections, closed loop (median over iterations):\n\n| target | req/s |\n|---|---|\n");
        for (label, rate) in &self.throughput {
            let _ = writeln!(t, "| {label} | {rate:.0} |");
        }
        t.push_str("\nMRTR rounds through the proxy, N calls at once (each: call → input_required → retry → result):\n\n| calls at once | rounds/s | p50 | p99 |\n|---|---|---|---|\n");
        for (level, rate, p50, p99) in &self.concurrency {
            let _ = writeln!(
                t,
                "| {level} | {rate:.0} | {:.2} ms | {:.2} ms |",
                ms(*p50),
                ms(*p99)
            );
        }
        let _ = writeln!(t, "\nrequestState sign + verify (HS256), timed in the harness: {:.2} µs (target ≤ 10 µs).", self.token_us);
        t
    }

    /// Prints the tables and, unless a smoke run, writes them into the docs.
    pub(crate) fn finish(self, took: Duration) {
        let body = format!(
            "{}\n\n{}\n\n{}\n\n{}\n{}\nMachine: {}. Date: {}. Command: `cargo bench --bench sidecar` ({:.0} s).",
            self.targets(),
            self.cpu_line(),
            self.capacity_line(),
            self.details(),
            self.tracing(),
            machine(),
            run(&["date", "-u", "+%Y-%m-%d %H:%M UTC"]),
            took.as_secs_f64(),
        );
        println!("{body}");
        if self.smoke {
            return;
        }
        if let Some(path) = &self.out {
            write_between_markers(path, &body);
            println!("written to {}", path.display());
        }
    }

    // The whole cost of the middle process, kernel included: what the latency differences are
    // made of once cross-CPU wake-ups are taken out.
    fn cpu_line(&self) -> String {
        let pair =
            |what: &str, nginx: &str, proxy: &str| match (self.cpu.get(nginx), self.cpu.get(proxy))
            {
                (Some(n), Some(p)) => {
                    format!(
                        "{what}: nginx {n:.1} µs, mrtr-proxy {p:.1} µs ({:.2}×)",
                        p / n.max(1e-9)
                    )
                }
                _ => format!("{what}: –"),
            };
        format!(
            "CPU per exchange of the process in the middle (all threads, kernel included): {}; {}; {}.",
            pair("legacy call", NGINX_CALL, PROXY_LEGACY_CALL),
            pair("modern call (vs nginx's legacy call)", NGINX_CALL, PROXY_MODERN_CALL),
            pair("round (legacy round vs MRTR round)", NGINX_ROUND, PROXY_ROUND),
        )
    }

    fn capacity_line(&self) -> String {
        self.capacity.as_ref().map_or_else(
            || "Calls parked at once (memory per call, resume and pass-through while they wait): not measured in this run.".into(),
            Capacity::section,
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn run(cmd: &[&str]) -> String {
    Command::new(cmd[0])
        .args(&cmd[1..])
        .output()
        .map(|o| {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text).trim().to_owned()
        })
        .unwrap_or_else(|_| "unknown".into())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("model name")?
                    .split(':')
                    .nth(1)
                    .map(|s| s.trim().to_owned())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = super::peers::cpus();
    let pinned = if super::peers::pinning() {
        "servers on CPU 0, load on CPU 1"
    } else {
        "not pinned"
    };
    format!(
        "{cpus} × {cpu} ({pinned}), Linux {}, {}, {}",
        run(&["uname", "-r"]),
        run(&["rustc", "-V"]),
        super::peers::nginx_binary()
            .map_or("no nginx".into(), |b| run(&[&b.to_string_lossy(), "-v"])),
    )
}

fn write_between_markers(path: &PathBuf, body: &str) {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let block = format!("{BEGIN}\n{body}\n{END}");
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if b < e => format!("{}{block}{}", &old[..b], &old[e + END.len()..]),
        _ => format!("{old}\n{block}\n"),
    };
    std::fs::write(path, new).expect("write the benchmark doc");
}
