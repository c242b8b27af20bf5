//! Benchmark harness (`cargo bench --bench round_trip`): what the proxy adds on loopback.
//!
//! 1. Latency: the built-in demo upstream (legacy, in this process) is driven (a) directly by a
//!    legacy client — POST the call, read the inline elicitation off the SSE stream, POST the
//!    answer, read the result — and (b) through the proxy binary by a modern client — the call
//!    returns `input_required`, the retry returns the result. Same tool, same answer; the
//!    difference is the proxy's cost for one round. A plain call is measured both ways too.
//! 2. Memory: N calls are parked in the proxy process; its RSS before and after, divided by N.
//!
//! Loops are bounded (ITERATIONS, PARKED); everything listens on 127.0.0.1 only.

#![allow(
    clippy::print_stdout,
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "a benchmark reports on stdout and fails loudly"
)]
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mrtr_proxy::body::{full, Body};
use mrtr_proxy::demo::client::ModernClient;
use mrtr_proxy::demo::upstream::DemoUpstream;
use mrtr_proxy::sse::SseDecoder;
use serde_json::{json, Value};
use support::{rss_kib, spawn_proxy, ProxyProcess};

mod support;

const ITERATIONS: usize = 300;
const WARMUP: usize = 30;
const PARKED: usize = 1000;

fn main() {
    support::block_on(run());
}

async fn run() {
    let up = DemoUpstream::start().await.expect("demo upstream");
    let (proxy, url) = spawn_bench_proxy(&up.url());
    let modern = ModernClient::new(url.clone(), json!({"elicitation":{"form":{}}}));
    let legacy = Legacy::connect(&up.url()).await;

    let direct_plain = measure(|| async { legacy.echo().await }).await;
    let proxied_plain = measure(|| async {
        let ex = modern
            .request(
                "tools/call",
                json!({"name":"echo","arguments":{"text":"x"}}),
            )
            .await
            .expect("call");
        assert_eq!(ex.result()["resultType"], "complete");
    })
    .await;
    let direct_round = measure(|| async { legacy.ask_name().await }).await;
    let proxied_round = measure(|| async { modern_round(&modern).await }).await;

    println!("one elicitation round, loopback, {ITERATIONS} iterations (after {WARMUP} warm-up):");
    report("direct legacy (inline elicitation)", &direct_round);
    report(
        "through mrtr-proxy (input_required + retry)",
        &proxied_round,
    );
    println!(
        "  => added by the proxy: median {:.3} ms",
        ms(median(&proxied_round)) - ms(median(&direct_round))
    );
    println!("plain tools/call:");
    report("direct legacy", &direct_plain);
    report("through mrtr-proxy", &proxied_plain);
    println!(
        "  => added by the proxy: median {:.3} ms",
        ms(median(&proxied_plain)) - ms(median(&direct_plain))
    );

    let before = rss_kib(proxy.id());
    let mut states = Vec::with_capacity(PARKED);
    for _ in 0..PARKED {
        let ex = modern
            .request("tools/call", json!({"name":"ask_name","arguments":{}}))
            .await
            .expect("park");
        states.push(
            ex.result()["requestState"]
                .as_str()
                .expect("state")
                .to_owned(),
        );
    }
    let after = rss_kib(proxy.id());
    let per = (after.saturating_sub(before) as f64) * 1024.0 / PARKED as f64;
    println!("memory: {PARKED} parked calls: proxy RSS {before} KiB -> {after} KiB, ~{per:.0} bytes per parked call");
    println!(
        "  (includes the upstream session each parked call leases: its GET stream and connection)"
    );
}

async fn modern_round(c: &ModernClient) {
    let ex = c
        .request("tools/call", json!({"name":"ask_name","arguments":{}}))
        .await
        .expect("call");
    let r = ex.result();
    let state = r["requestState"].as_str().expect("state");
    let params = json!({"name":"ask_name","arguments":{},"requestState":state,"inputResponses":{"elicitation-1":{"action":"accept","content":{"name":"B"}}}});
    let ex = c.request("tools/call", params).await.expect("retry");
    assert_eq!(ex.result()["content"][0]["text"], "Hello, B!");
}

async fn measure<F, Fut>(mut f: F) -> Vec<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..WARMUP {
        f().await;
    }
    let mut out = Vec::with_capacity(ITERATIONS);
    for _ in 0..ITERATIONS {
        let t = Instant::now();
        f().await;
        out.push(t.elapsed());
    }
    out.sort();
    out
}

fn median(v: &[Duration]) -> Duration {
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn report(label: &str, v: &[Duration]) {
    let p99 = v[(v.len() * 99 / 100).min(v.len() - 1)];
    println!(
        "  {label:<46} median {:>7.3} ms  p99 {:>7.3} ms",
        ms(median(v)),
        ms(p99)
    );
}

fn spawn_bench_proxy(upstream: &str) -> (ProxyProcess, String) {
    // Every parked call holds an upstream session: room for PARKED of them, one principal.
    let config = format!(
        "[pool]\nmax_sessions = {n}\n[state]\nmax_parked = {n}\nmax_parked_per_principal = {n}\n",
        n = PARKED + 16
    );
    spawn_proxy(upstream, "bench", &config)
}

struct Legacy {
    http: Client<HttpConnector, Body>,
    url: String,
    session: String,
}

impl Legacy {
    async fn connect(url: &str) -> Self {
        let http = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        let mut me = Self {
            http,
            url: url.to_owned(),
            session: String::new(),
        };
        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{}},"clientInfo":{"name":"bench","version":"0"}}});
        let resp = me.post(init).await;
        me.session = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .expect("session")
            .to_owned();
        let _ = resp.into_body().collect().await;
        let _ = me
            .post(json!({"jsonrpc":"2.0","method":"notifications/initialized"}))
            .await
            .into_body()
            .collect()
            .await;
        me
    }

    async fn post(&self, msg: Value) -> http::Response<hyper::body::Incoming> {
        let mut b = http::Request::post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25");
        if !self.session.is_empty() {
            b = b.header("mcp-session-id", &self.session);
        }
        self.http
            .request(b.body(full(Bytes::from(msg.to_string()))).expect("request"))
            .await
            .expect("send")
    }

    async fn echo(&self) {
        let resp = self.post(json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}})).await;
        let mut body = resp.into_body();
        let mut dec = SseDecoder::new(1 << 20);
        loop {
            let frame = body.frame().await.expect("frame").expect("ok");
            if let Ok(d) = frame.into_data() {
                if dec
                    .feed(&d)
                    .expect("sse")
                    .iter()
                    .any(|e| e.data.contains("\"result\""))
                {
                    return;
                }
            }
        }
    }

    async fn ask_name(&self) {
        let resp = self.post(json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"ask_name","arguments":{}}})).await;
        let mut body = resp.into_body();
        let mut dec = SseDecoder::new(1 << 20);
        loop {
            let frame = body.frame().await.expect("frame").expect("ok");
            let Ok(d) = frame.into_data() else { continue };
            for ev in dec.feed(&d).expect("sse") {
                let msg: Value = serde_json::from_str(&ev.data).expect("json");
                if msg["method"] == "elicitation/create" {
                    let answer = json!({"jsonrpc":"2.0","id":msg["id"],"result":{"action":"accept","content":{"name":"B"}}});
                    let _ = self.post(answer).await.into_body().collect().await;
                } else if msg.get("result").is_some() {
                    return;
                }
            }
        }
    }
}
