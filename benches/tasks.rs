//! `cargo bench --bench tasks`: what a task costs. Two proxy processes share a key; the first
//! (the owner) runs TASKS tasks of the built-in server's slow `provision` tool, each waiting for
//! the client's answer (`input_required`), and the second lists the first as its peer. Reports:
//!
//! - the owner's RSS per waiting task (the task's record, its call actor, its upstream session);
//! - `tasks/get` latency (p50 / p99 over GETS requests, one at a time) on the owner and through
//!   the peer (one forward), beside a plain `tools/call` of `echo` for scale;
//! - `tasks/update` latency (each answers one task), half on the owner, half through the peer.
//!
//! Then the same with the tasks in a shared store (`[tasks] store`, a `redis-server` of the
//! bench's own on a free loopback port, without persistence): `tasks/get` on the peer is read
//! from the store (no forward), what the store holds (Redis's `used_memory` per task), and the
//! time from the owner's SIGKILL to the task adopted on the peer (the lease is 1 s).
//!
//! Then FINISHED more tasks (`provision`, answered once they ask, finished: a record and a result each) on the
//! owner: its RSS and the store's `used_memory` per finished task, and `tasks/get` among them.
//!
//! Bounded: TASKS + FINISHED tasks, GETS requests per measure, 60 s for the tasks to ask;
//! loopback only. `MRTR_BENCH_TASKS` and `MRTR_BENCH_FINISHED_TASKS` override the counts.

#![allow(
    clippy::print_stdout,
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "a benchmark reports on stdout and fails loudly"
)]

use std::time::{Duration, Instant};

use mrtr_proxy::demo::client::ModernClient;
use mrtr_proxy::demo::upstream::DemoUpstream;
use serde_json::{json, Value};
use support::{rss_kib, spawn_proxy, ProxyProcess};

mod support;

const TASKS: usize = 500;
const GETS: usize = 2000;
/// Both processes verify with this key, as replicas of one deployment do.
const SECRET: &str = "bench-tasks-shared-secret-0123456789abcdef";

fn tasks() -> usize {
    support::env_or("MRTR_BENCH_TASKS", TASKS)
}

/// Finished tasks added after the waiting ones (`MRTR_BENCH_FINISHED_TASKS` overrides).
const FINISHED: usize = 10_000;

fn finished_tasks() -> usize {
    support::env_or("MRTR_BENCH_FINISHED_TASKS", FINISHED)
}

fn main() {
    support::block_on(async {
        run(None).await;
        let store = Store::start();
        run(Some(&store)).await;
    });
}

async fn run(store: Option<&Store>) {
    let n = tasks();
    let up = DemoUpstream::start().await.expect("demo upstream");
    let shared = store.map(Store::config).unwrap_or_default();
    let (owner, owner_url) = spawn_proxy(&up.url(), "tasks-owner", &config(n, None, &shared));
    let peer_config = config(n, Some(&owner_url), &shared);
    let (_peer, peer_url) = spawn_proxy(&up.url(), "tasks-peer", &peer_config);
    let caps =
        json!({"elicitation": {"form": {}}, "extensions": {"io.modelcontextprotocol/tasks": {}}});
    let here = ModernClient::new(owner_url, caps.clone());
    let there = ModernClient::new(peer_url, caps);
    println!(
        "== tasks {}",
        if store.is_some() {
            "in a shared store (redis-server)"
        } else {
            "in memory"
        }
    );
    let start = rss_kib(owner.id());
    let before = store.map_or(0, Store::used_memory);
    let ids = create(&here, n).await;
    wait_asking(&here, &ids).await;
    let asking = rss_kib(owner.id());
    let per = (asking.saturating_sub(start) as f64) * 1024.0 / n as f64;
    println!("owner RSS: {start} KiB at start, {asking} KiB with {n} tasks waiting for input (~{per:.0} B per task)");
    if let Some(store) = store {
        let per = store.used_memory().saturating_sub(before) as f64 / n as f64;
        println!("store: ~{per:.0} B per task waiting for input (Redis used_memory)");
    }
    measure(&here, &there, &ids).await;
    finished(&here, store, owner.id()).await;
    if store.is_some() {
        adoption(owner, &there, &ids[n - 1]).await;
    } else {
        drop(owner);
    }
}

// The latencies: a plain call for scale, tasks/get on the owner and on the peer, tasks/update
// on each (half the tasks each, all but the last).
async fn measure(here: &ModernClient, there: &ModernClient, ids: &[String]) {
    let echo = latency(GETS, || async {
        let r = here
            .request(
                "tools/call",
                json!({"name": "echo", "arguments": {"text": "x"}}),
            )
            .await
            .unwrap();
        assert_eq!(r.result()["resultType"], "complete");
    })
    .await;
    report("plain tools/call (echo), for scale", &echo);
    for (name, client) in [
        ("tasks/get on the owner", here),
        ("tasks/get on the peer", there),
    ] {
        let id = &ids[0];
        let got = latency(GETS, || async {
            let r = client
                .request("tasks/get", json!({"taskId": id}))
                .await
                .unwrap();
            assert_eq!(r.result()["status"], "input_required", "{:?}", r.last);
        })
        .await;
        report(name, &got);
    }
    let (mine, forwarded) = ids[..ids.len() - 1].split_at(ids.len() / 2);
    report("tasks/update on the owner", &updates(here, mine).await);
    report(
        "tasks/update through the peer",
        &updates(there, forwarded).await,
    );
}

// FINISHED more tasks of `provision`, each answered once it asks (in batches of BATCH), so that
// each holds its record and result only: what they cost the owner and the store, and
// `tasks/get` of one of them among all.
async fn finished(here: &ModernClient, store: Option<&Store>, owner: u32) {
    const BATCH: usize = 64;
    let n = finished_tasks();
    let start = rss_kib(owner);
    let before = store.map_or(0, Store::used_memory);
    let mut last = Vec::new();
    for done in (0..n).step_by(BATCH) {
        let ids = create(here, BATCH.min(n - done)).await;
        wait_asking(here, &ids).await;
        updates(here, &ids).await;
        wait_status(here, &ids, "completed").await;
        last = ids;
    }
    let Some(last) = last.pop() else { return };
    let got = latency(GETS, || async {
        let r = here
            .request("tasks/get", json!({"taskId": &last}))
            .await
            .unwrap();
        assert_eq!(r.result()["status"], "completed", "{:?}", r.last);
    })
    .await;
    let after = rss_kib(owner);
    let per = (after.saturating_sub(start) as f64) * 1024.0 / n as f64;
    println!(
        "owner RSS: +{} KiB with {n} finished tasks (~{per:.0} B per task)",
        after.saturating_sub(start)
    );
    if let Some(store) = store {
        let per = store.used_memory().saturating_sub(before) as f64 / n as f64;
        println!("store: ~{per:.0} B per finished task (Redis used_memory)");
    }
    report(&format!("tasks/get of a finished task among {n}"), &got);
}

// SIGKILLs the owner, then polls task `id` on the peer until it is adopted (it stops being
// `input_required`: `provision` is not replay-safe, so it fails); the time from the kill.
async fn adoption(owner: ProxyProcess, peer: &ModernClient, id: &str) {
    let killed = Instant::now();
    drop(owner);
    let deadline = killed + Duration::from_secs(30);
    loop {
        let r = peer
            .request("tasks/get", json!({"taskId": id}))
            .await
            .unwrap();
        if r.result()["status"] == "failed" {
            break;
        }
        assert!(Instant::now() < deadline, "never adopted: {:?}", r.last);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!(
        "owner SIGKILLed -> task adopted on the peer: {} ms (lease 1 s)",
        killed.elapsed().as_millis()
    );
}

/// The bench's own `redis-server`, killed when dropped.
struct Store {
    port: u16,
    child: std::process::Child,
}

impl Store {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (apt-get install redis-server)");
        let store = Self { port, child };
        let deadline = Instant::now() + Duration::from_secs(10);
        while store.info().is_none() {
            assert!(Instant::now() < deadline, "redis-server did not answer");
            std::thread::sleep(Duration::from_millis(20));
        }
        store
    }

    fn config(&self) -> String {
        format!(
            "store = \"redis://127.0.0.1:{}/0\"\nstore_timeout = \"300ms\"\nlease = \"1s\"\n",
            self.port
        )
    }

    fn info(&self) -> Option<String> {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "info", "memory"])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn used_memory(&self) -> u64 {
        self.info()
            .and_then(|i| {
                i.lines()
                    .find_map(|l| l.strip_prefix("used_memory:"))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn config(n: usize, peer: Option<&str>, store: &str) -> String {
    let peers = peer.map_or(String::new(), |p| format!("[cluster]\npeers = [\"{p}\"]\n"));
    format!(
        "[pool]\nmax_sessions = {s}\n[state]\nsecret = \"{SECRET}\"\n[tasks]\nmax = {s}\nmax_per_principal = {s}\nmax_memory = \"1GiB\"\n{store}[tasks.tools]\nprovision = \"always\"\n{peers}",
        s = n + finished_tasks() + 16
    )
}

// Starts `n` tasks of `provision`; returns their ids.
async fn create(client: &ModernClient, n: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let r = client
            .request(
                "tools/call",
                json!({"name": "provision", "arguments": {"vm": format!("vm-{i}")}}),
            )
            .await
            .expect("tools/call");
        assert_eq!(r.result()["resultType"], "task", "{:?}", r.last);
        ids.push(r.result()["taskId"].as_str().unwrap().to_owned());
    }
    ids
}

// Waits (at most 60 s) until every task asks for input.
async fn wait_asking(client: &ModernClient, ids: &[String]) {
    wait_status(client, ids, "input_required").await;
}

// Waits (at most 60 s) until every task has `status`.
async fn wait_status(client: &ModernClient, ids: &[String], status: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    for id in ids {
        loop {
            let r = client
                .request("tasks/get", json!({"taskId": id}))
                .await
                .unwrap();
            if r.result()["status"] == status {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "tasks never {status}: {:?}",
                r.last
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

// Answers each task of `ids` (one tasks/update each); the latencies.
async fn updates(client: &ModernClient, ids: &[String]) -> Vec<Duration> {
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let got = client
            .request("tasks/get", json!({"taskId": id}))
            .await
            .unwrap();
        let key = first_key(got.result());
        let answer = json!({"taskId": id, "inputResponses": {key: {"action": "accept", "content": {"name": "bench"}}}});
        let t = Instant::now();
        let r = client.request("tasks/update", answer).await.unwrap();
        out.push(t.elapsed());
        assert_eq!(r.result()["resultType"], "complete", "{:?}", r.last);
    }
    out
}

fn first_key(task: &Value) -> String {
    task["inputRequests"]
        .as_object()
        .and_then(|m| m.keys().next().cloned())
        .expect("an input_required task lists its requests")
}

async fn latency<F, Fut>(n: usize, f: F) -> Vec<Duration>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f().await;
        out.push(t.elapsed());
    }
    out
}

fn report(what: &str, samples: &[Duration]) {
    let mut s = samples.to_vec();
    s.sort();
    let at = |q: f64| s[((s.len() as f64 * q) as usize).min(s.len() - 1)];
    println!(
        "{what}: p50 {} µs, p99 {} µs ({} requests, sequential)",
        at(0.5).as_micros(),
        at(0.99).as_micros(),
        s.len()
    );
}
