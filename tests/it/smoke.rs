//! The real binary: serves /healthz, exits cleanly on SIGTERM; the demo walkthrough passes.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_mrtr-proxy");

#[tokio::test]
async fn binary_serves_healthz_and_exits_on_sigterm() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/config/mrtr-proxy.toml");
    let mut child = Command::new(BIN)
        .args([
            "--config",
            config,
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:9/mcp",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.contains("listening on"))
            .unwrap()
    })
    .await
    .unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap();
    let base = url.trim_end_matches("/mcp");
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, mrtr_proxy::body::Body>(
        hyper_util::client::legacy::connect::HttpConnector::new(),
    );
    let get = |p: &str| {
        http::Request::get(format!("{base}{p}"))
            .body(mrtr_proxy::body::empty())
            .unwrap()
    };
    assert_eq!(http.request(get("/healthz")).await.unwrap().status(), 200);
    assert_eq!(
        http.request(get("/readyz")).await.unwrap().status(),
        503,
        "nothing listens upstream"
    );
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn check_config_names_the_bad_key() {
    let ok = Command::new(BIN)
        .args([
            "check-config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config/mrtr-proxy.toml"),
        ])
        .output()
        .unwrap();
    assert!(ok.status.success());
    let bad = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/config/invalid/ttl.toml"
    );
    let out = Command::new(BIN)
        .args(["check-config", bad])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("state.ttl"));
}

#[test]
fn demo_once_walks_through_and_exits_zero() {
    // Bounded by nextest's slow-timeout (.config/nextest.toml).
    let output = Command::new(BIN).args(["demo", "--once"]).output().unwrap();
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{:?} {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        out.contains("Hello, Ada!")
            && out.contains("inputRequests")
            && out.contains("walkthrough complete"),
        "{out}"
    );
}
