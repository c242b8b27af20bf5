//! `cargo bench --bench parked_memory`: the proxy's RSS (its own process) while 3 000 calls are
//! parked — right after parking and again once the allocator's decay is past, every call still
//! parked — and after they expired, over three cycles. Each call carries a 4 KiB argument. Shows
//! what a parked call costs and whether that memory comes back once the calls are gone.
//!
//! Each reading is the whole RSS and its anonymous part (heap and stacks, without the program's
//! own pages, which the first calls page in once: ~4.6 MB). Before the first reading, WARMUP
//! rounds run to their end (parked, answered, resumed), as the sidecar bench's capacity phase
//! does, and the allocator's decay is let pass: what the first calls set up once (the program's
//! pages, the allocator's first arenas, one pooled upstream session) is then in the baseline,
//! not spread over the parked calls (`MRTR_BENCH_WARMUP=0` measures a fresh process instead).
//!
//! Bounded: WARMUP rounds and a wait of 15 s; then CALLS per cycle, CYCLES, two waits of 15 s and
//! one of at most 120 s for expiry each; loopback only.
//!
//! `MRTR_BENCH_UPSTREAM=python` parks them in front of the official Python SDK's legacy server
//! (`tests/interop/servers/py_legacy_server.py` on `tests/interop/.venv/mcp1`, its `ask_name`
//! tool, no argument) instead of the in-repo Rust upstream; `MRTR_BENCH_CALLS` sets how many
//! (the Python server is slower to park: 400 is the figure of docs/BENCHMARKS.md § Issue 35),
//! `MRTR_BENCH_ARG_BYTES` the Rust upstream's argument size (0 to compare with the Python
//! server's calls, which carry none).

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
use support::{rss_anon_kib, rss_kib, spawn_proxy, ProxyProcess};

mod support;

const CALLS: usize = 3000;
const CYCLES: usize = 3;

fn calls() -> usize {
    support::env_or("MRTR_BENCH_CALLS", CALLS)
}

// `MRTR_BENCH_SETTLE_S` overrides the 15 s given the allocator's decay before a reading.
fn settle_s() -> u64 {
    support::env_or("MRTR_BENCH_SETTLE_S", 15)
}

// Rounds run to their end before the baseline reading.
const WARMUP: usize = 20;

// `MRTR_BENCH_WARMUP` overrides WARMUP (0: the baseline is a proxy that has served nothing).
fn warmup() -> usize {
    support::env_or("MRTR_BENCH_WARMUP", WARMUP)
}

// `MRTR_BENCH_CYCLES` overrides CYCLES (e.g. 1 for a quicker look).
fn cycles() -> usize {
    support::env_or("MRTR_BENCH_CYCLES", CYCLES)
}
// Every call of a cycle is parked before the first expires (state.ttl = 60 s).
const ARG_BYTES: usize = 4096;

// `MRTR_BENCH_ARG_BYTES` overrides ARG_BYTES (the Rust upstream's calls only).
fn arg_bytes() -> usize {
    support::env_or("MRTR_BENCH_ARG_BYTES", ARG_BYTES)
}

fn main() {
    support::block_on(run());
}

async fn run() {
    let python = std::env::var("MRTR_BENCH_UPSTREAM").is_ok_and(|v| v == "python");
    let (_up, upstream) = if python {
        let server = python_server();
        let url = server.1.clone();
        (Upstream::Python(server.0), url)
    } else {
        let up = DemoUpstream::start().await.expect("demo upstream");
        let url = up.url();
        (Upstream::Rust(up), url)
    };
    let calls = calls();
    let (proxy, url) = spawn_memory_proxy(&upstream, calls);
    let client = ModernClient::new(url.clone(), json!({"elicitation": {"form": {}}}));
    let metrics = url.trim_end_matches("/mcp").to_owned() + "/metrics";
    let pad = if python {
        String::new()
    } else {
        "x".repeat(arg_bytes())
    };
    let arguments = if python {
        json!({})
    } else {
        json!({"pad": pad})
    };
    for _ in 0..warmup() {
        round(&client, &arguments).await;
    }
    // As before every later reading: what the rounds freed, the allocator gives back first.
    tokio::time::sleep(Duration::from_secs(settle_s())).await;
    let start = rss_kib(proxy.id());
    let start_anon = rss_anon_kib(proxy.id());
    println!(
        "proxy RSS at start: {start} KiB after {} rounds; {calls} calls parked per cycle, {} B argument each, {} upstream",
        warmup(),
        pad.len(),
        if python { "Python SDK" } else { "Rust" }
    );
    for cycle in 1..=cycles() {
        for _ in 0..calls {
            park(&client, &arguments).await;
        }
        let peak = rss_kib(proxy.id());
        let peak_anon = rss_anon_kib(proxy.id());
        let at_peak = parked(&metrics).await;
        // The peak still holds what parking freed and the allocator has not given back yet (it
        // does within its 10 s decay): the RSS once that is past, every call still parked
        // (state.ttl is 60 s), is what the parked calls hold.
        tokio::time::sleep(Duration::from_secs(settle_s())).await;
        let settled = rss_kib(proxy.id());
        let settled_anon = rss_anon_kib(proxy.id());
        let still = parked(&metrics).await;
        if still != at_peak {
            println!(
                "({} calls expired before the second reading: it is not per call)",
                at_peak - still
            );
        }
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
        let per = |rss: u64, from: u64| {
            (rss.saturating_sub(from) as f64) * 1024.0 / at_peak.max(1) as f64
        };
        println!(
            "cycle {cycle}: {at_peak} parked: {peak} KiB (~{:.0} B per call; anonymous {peak_anon} KiB, ~{:.0} B per call); {}s later, {still} parked: {settled} KiB (~{:.0} B per call; anonymous ~{:.0} B per call); after expiry {after} KiB ({sessions} upstream sessions, {fds} fds open)",
            per(peak, start),
            per(peak_anon, start_anon),
            settle_s(),
            per(settled, start),
            per(settled_anon, start_anon),
        );
    }
    drop(proxy);
}

// One call of `ask_name`, parked: its `input_required` result.
async fn park(client: &ModernClient, arguments: &serde_json::Value) -> serde_json::Value {
    let ex = client
        .request(
            "tools/call",
            json!({"name": "ask_name", "arguments": arguments}),
        )
        .await
        .expect("park");
    assert_eq!(ex.result()["resultType"], "input_required", "{:?}", ex.last);
    ex.result().clone()
}

// One round to its end: the call parks, every input request is answered, the call completes.
async fn round(client: &ModernClient, arguments: &serde_json::Value) {
    let asked = park(client, arguments).await;
    let answers: serde_json::Map<String, serde_json::Value> = asked["inputRequests"]
        .as_object()
        .expect("inputRequests")
        .keys()
        .map(|k| {
            (
                k.clone(),
                json!({"action": "accept", "content": {"name": "W"}}),
            )
        })
        .collect();
    let done = client
        .request(
            "tools/call",
            json!({"name": "ask_name", "arguments": arguments,
                "inputResponses": answers, "requestState": asked["requestState"]}),
        )
        .await
        .expect("resume");
    assert_eq!(
        done.result()["content"][0]["text"],
        "Hello, W!",
        "{:?}",
        done.last
    );
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

// What the calls park in front of (kept alive for the run; the Python server is killed with it).
enum Upstream {
    Rust(#[expect(dead_code, reason = "held: the upstream serves while it lives")] DemoUpstream),
    Python(#[expect(dead_code, reason = "held: dropping it stops the server")] PythonServer),
}

struct PythonServer(std::process::Child);

impl Drop for PythonServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// The official Python SDK's legacy server on port 0; returns it and its MCP URL.
fn python_server() -> (PythonServer, String) {
    use std::io::BufRead;
    let root = env!("CARGO_MANIFEST_DIR");
    let mut child =
        std::process::Command::new(format!("{root}/tests/interop/.venv/mcp1/bin/python"))
            .arg(format!("{root}/tests/interop/servers/py_legacy_server.py"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the Python legacy server (tests/interop/.venv/mcp1)");
    let out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut lines = out.lines().map_while(Result::ok);
    let port = lines
        .by_ref()
        .take(100)
        .find_map(|l| l.strip_prefix("READY ").map(str::to_owned))
        .expect("READY <port>");
    std::thread::spawn(move || for _ in lines {});
    (PythonServer(child), format!("http://127.0.0.1:{port}/mcp"))
}

fn spawn_memory_proxy(upstream: &str, calls: usize) -> (ProxyProcess, String) {
    let config = format!(
        "[pool]\nmax_sessions = {n}\n[state]\nttl = \"60s\"\nmax_parked = {n}\nmax_parked_per_principal = {n}\n",
        n = calls + 16
    );
    spawn_proxy(upstream, "mem", &config)
}
