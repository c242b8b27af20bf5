//! `cargo bench --bench parked_memory`: the proxy's RSS (its own process) while 3 000 calls are
//! parked, and after they expired, over three cycles. Each call carries a 4 KiB argument. Shows
//! what a parked call costs and whether that memory comes back once the calls are gone.
//!
//! Bounded: CALLS per cycle, CYCLES, and a 120 s wait for expiry each; loopback only.

#![allow(
    clippy::print_stdout,
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "a benchmark reports on stdout and fails loudly"
)]

use std::time::{Duration, Instant};

use mrtr_proxy::demo::client::ModernClient;
use mrtr_proxy::demo::upstream::DemoUpstream;
use serde_json::json;
use support::{rss_kib, spawn_proxy, ProxyProcess};

mod support;

const CALLS: usize = 3000;
const CYCLES: usize = 3;

// `MRTR_BENCH_CYCLES` overrides CYCLES (e.g. 1 for a quicker look).
fn settle_s() -> u64 {
    std::env::var("MRTR_BENCH_SETTLE_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15)
}

fn cycles() -> usize {
    std::env::var("MRTR_BENCH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CYCLES)
}
// Every call of a cycle is parked before the first expires (state.ttl = 60 s).
const ARG_BYTES: usize = 4096;

fn main() {
    support::block_on(run());
}

async fn run() {
    let up = DemoUpstream::start().await.expect("demo upstream");
    let (proxy, url) = spawn_memory_proxy(&up.url());
    let client = ModernClient::new(url.clone(), json!({"elicitation": {"form": {}}}));
    let metrics = url.trim_end_matches("/mcp").to_owned() + "/metrics";
    let start = rss_kib(proxy.id());
    println!("proxy RSS at start: {start} KiB; {CALLS} calls parked per cycle, {ARG_BYTES} B argument each");
    let pad = "x".repeat(ARG_BYTES);
    for cycle in 1..=cycles() {
        for _ in 0..CALLS {
            let ex = client
                .request(
                    "tools/call",
                    json!({"name": "ask_name", "arguments": {"pad": pad}}),
                )
                .await
                .expect("park");
            assert_eq!(ex.result()["resultType"], "input_required", "{:?}", ex.last);
        }
        let peak = rss_kib(proxy.id());
        let at_peak = parked(&metrics).await;
        let deadline = Instant::now() + Duration::from_secs(120);
        while parked(&metrics).await > 0 {
            assert!(Instant::now() < deadline, "the parked calls never expired");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Sessions of expired calls are closed right after, and jemalloc purges what was freed
        // within its 10 s decay: read the RSS 15 s later (`MRTR_BENCH_SETTLE_S` overrides).
        tokio::time::sleep(Duration::from_secs(settle_s())).await;
        let after = rss_kib(proxy.id());
        let fds = std::fs::read_dir(format!("/proc/{}/fd", proxy.id())).map_or(0, Iterator::count);
        let sessions = gauge(&metrics, "mrtr_upstream_sessions").await;
        let per = (peak.saturating_sub(start) as f64) * 1024.0 / at_peak.max(1) as f64;
        println!("cycle {cycle}: {at_peak} parked: {peak} KiB (~{per:.0} B per call); after expiry {after} KiB ({sessions} upstream sessions, {fds} fds open)");
    }
    drop(proxy);
}

async fn parked(metrics: &str) -> u64 {
    gauge(metrics, "mrtr_parked_calls").await
}

async fn gauge(metrics: &str, name: &str) -> u64 {
    let c = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<mrtr_proxy::body::Body>();
    let req = http::Request::get(metrics)
        .body(mrtr_proxy::body::empty())
        .unwrap();
    let body = http_body_util::BodyExt::collect(c.request(req).await.unwrap().into_body())
        .await
        .unwrap()
        .to_bytes();
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn spawn_memory_proxy(upstream: &str) -> (ProxyProcess, String) {
    let config = format!(
        "[pool]\nmax_sessions = {n}\n[state]\nttl = \"60s\"\nmax_parked = {n}\nmax_parked_per_principal = {n}\n",
        n = CALLS + 16
    );
    spawn_proxy(upstream, "mem", &config)
}
