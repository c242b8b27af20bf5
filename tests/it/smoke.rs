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
    let status = terminate(child).await;
    assert!(status.success(), "{status:?}");
}

/// Sends SIGTERM and waits for the exit.
pub(crate) async fn terminate(child: std::process::Child) -> std::process::ExitStatus {
    sigterm(&child);
    exit_of(child).await
}

fn sigterm(child: &std::process::Child) {
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
}

async fn exit_of(mut child: std::process::Child) -> std::process::ExitStatus {
    tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap()
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
fn check_config_takes_the_file_as_an_argument_or_as_config() {
    let good = concat!(env!("CARGO_MANIFEST_DIR"), "/config/mrtr-proxy.toml");
    let bad = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/config/invalid/ttl.toml"
    );
    let run = |args: &[&str]| Command::new(BIN).args(args).output().unwrap();
    for args in [
        &["check-config", "--config", good][..],
        &["--config", good, "check-config"],
        &["check-config", good, "--config", good],
    ] {
        let out = run(args);
        assert!(out.status.success(), "{args:?}: {out:?}");
    }
    let out = run(&["check-config", "--config", bad]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("state.ttl"));
    let out = run(&["check-config"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("which file?"));
    let out = run(&["check-config", good, "--config", bad]);
    assert_eq!(out.status.code(), Some(64), "two different files");
    assert!(String::from_utf8_lossy(&out.stderr).contains("give one"));
}

#[tokio::test]
async fn a_relayed_legacy_request_s_access_line_names_its_method_and_id() {
    let up = mrtr_proxy::demo::upstream::DemoUpstream::start()
        .await
        .unwrap();
    let dir = std::env::temp_dir().join(format!("mrtr-access-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("access.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[log]\nformat = \"json\"\n[upstream]\nurl = \"{}\"\n",
            up.url()
        ),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["--config", config.to_str().unwrap()])
        .env("RUST_LOG", "info,mrtr_proxy::access=debug")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = Stderr::of(&mut child);
    let child = Running(Some(child));
    let url = url_in(&stderr.wait_for("listening on"));
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<mrtr_proxy::body::Body>();
    let post = |sid: Option<&str>, body: serde_json::Value| {
        let mut b = http::Request::post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(sid) = sid {
            b = b.header("mcp-session-id", sid);
        }
        http.request(b.body(mrtr_proxy::body::full(body.to_string())).unwrap())
    };
    let init = serde_json::json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"legacy","version":"1"}}});
    let resp = post(None, init).await.unwrap();
    let sid = resp.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    drop(resp);
    let list = serde_json::json!({"jsonrpc":"2.0","id":"list-7","method":"tools/list"});
    let resp = post(Some(&sid), list).await.unwrap();
    assert_eq!(resp.status(), 200);
    drop(resp);
    let batch = serde_json::json!([{"jsonrpc":"2.0","id":8,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/initialized"}]);
    drop(post(Some(&sid), batch).await.unwrap());
    let span_of = |needle: &str| -> serde_json::Value {
        let line = stderr.wait_for(needle);
        let log: serde_json::Value = serde_json::from_str(&line).expect("a JSON log line");
        assert_eq!(log["target"], "mrtr_proxy::access", "{line}");
        log["span"].clone()
    };
    let span = span_of(r#""rpc.method":"initialize""#);
    assert_eq!(span["rpc.id"], "0", "{span}");
    let span = span_of(r#""rpc.method":"tools/list""#);
    assert_eq!(span["rpc.id"], r#""list-7""#, "{span}");
    assert_eq!(span["outcome"], "relayed", "{span}");
    let span = span_of(r#""rpc.method":"ping,notifications/initialized""#);
    assert_eq!(span["rpc.id"], "8", "{span}");
    let status = terminate(child.take()).await;
    assert!(status.success(), "{status:?}");
    let _ = std::fs::remove_dir_all(&dir);
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

/// A child process killed if the test fails before it ends it.
pub(crate) struct Running(pub(crate) Option<std::process::Child>);

impl Running {
    /// The child, for the test to end it itself.
    pub(crate) fn take(mut self) -> std::process::Child {
        self.0.take().expect("taken once")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The binary's stderr, line by line, collected by a thread.
pub(crate) struct Stderr(std::sync::mpsc::Receiver<String>);

impl Stderr {
    pub(crate) fn of(child: &mut std::process::Child) -> Self {
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self(rx)
    }

    /// The first line containing `needle` (panics after 20 s).
    pub(crate) fn wait_for(&self, needle: &str) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self.0.recv_timeout(left).expect(needle);
            if line.contains(needle) {
                return line;
            }
        }
    }
}

/// The first URL in a log line.
pub(crate) fn url_in(line: &str) -> String {
    line.split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap()
        .to_owned()
}

async fn status_of(url: &str) -> u16 {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<mrtr_proxy::body::Body>();
    let req = http::Request::get(url)
        .body(mrtr_proxy::body::empty())
        .unwrap();
    http.request(req).await.unwrap().status().as_u16()
}

fn healthcheck(url: &str) -> std::process::ExitStatus {
    Command::new(BIN)
        .args(["healthcheck", "--url", url])
        .stderr(Stdio::null())
        .status()
        .unwrap()
}

#[tokio::test]
async fn an_admin_listener_serves_the_probes_apart_and_logs_can_be_json() {
    let dir = std::env::temp_dir().join(format!("mrtr-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("admin.toml");
    std::fs::write(
        &config,
        "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[log]\nformat = \"json\"\n[upstream]\nurl = \"http://127.0.0.1:9/mcp\"\n",
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["--config", config.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = Stderr::of(&mut child);
    let main = url_in(&stderr.wait_for("listening on"));
    let base = main.trim_end_matches("/mcp").to_owned();
    let admin = url_in(&stderr.wait_for("admin on"));
    assert_eq!(status_of(&format!("{admin}/healthz")).await, 200);
    assert_eq!(status_of(&format!("{admin}/metrics")).await, 200);
    assert_eq!(
        status_of(&format!("{admin}/mcp")).await,
        404,
        "no MCP on the admin port"
    );
    assert_eq!(
        status_of(&format!("{base}/healthz")).await,
        404,
        "no probes on the MCP port"
    );
    assert!(healthcheck(&format!("{admin}/healthz")).success());
    assert!(
        !healthcheck(&format!("{admin}/readyz")).success(),
        "nothing listens upstream"
    );

    sigterm(&child);
    let line = stderr.wait_for("shutting down");
    let log: serde_json::Value = serde_json::from_str(&line).expect("a JSON log line");
    assert_eq!(log["level"], "INFO", "{line}");
    assert_eq!(
        log["fields"]["message"], "shutting down: draining",
        "{line}"
    );
    let status = exit_of(child).await;
    assert!(status.success(), "{status:?}");
    assert!(
        !healthcheck(&format!("{admin}/healthz")).success(),
        "the proxy is gone"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_signing_key_comes_from_a_file_or_the_environment_and_is_checked() {
    let dir = std::env::temp_dir().join(format!("mrtr-secret-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let short = dir.join("short");
    std::fs::write(&short, "too-short\n").unwrap();
    let config = dir.join("c.toml");
    let run = |config_text: String, env: Option<&str>| {
        std::fs::write(&config, config_text).unwrap();
        let mut cmd = Command::new(BIN);
        // check-config reads the key files and the environment as start-up does.
        cmd.args(["check-config", config.to_str().unwrap()]);
        cmd.env_remove("MRTR_STATE_SECRET");
        if let Some(v) = env {
            cmd.env("MRTR_STATE_SECRET", v);
        }
        cmd.output().unwrap()
    };
    let file = format!("[state]\nsecret_file = \"{}\"\n", short.display());
    let out = run(file, None);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("state.secret_file"));
    let out = run(String::new(), Some("short"));
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("MRTR_STATE_SECRET"));
    // A good key loads.
    let out = run(String::new(), Some("0123456789abcdef0123456789abcdef"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let verify = format!("[state]\nverify_secret_files = [\"{}\"]\n", short.display());
    let out = run(verify, None);
    assert_eq!(
        out.status.code(),
        Some(64),
        "a short verification key is refused too"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("state.verify_secret_files"));
    let both = format!(
        "[state]\nsecret = \"0123456789abcdef0123456789abcdef\"\nsecret_file = \"{}\"\n",
        short.display()
    );
    assert_eq!(
        run(both, None).status.code(),
        Some(64),
        "secret and secret_file exclude each other"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_config_refuses_a_shared_task_store_without_a_shared_key_or_a_readable_password() {
    let dir = std::env::temp_dir().join(format!("mrtr-store-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("c.toml");
    let run = |config_text: &str| {
        std::fs::write(&config, config_text).unwrap();
        let out = Command::new(BIN)
            .args(["check-config", config.to_str().unwrap()])
            .env_remove("MRTR_STATE_SECRET")
            .env_remove("MRTR_TEST_STORE_PASSWORD")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let key = "[state]\nsecret = \"0123456789abcdef0123456789abcdef\"\n";
    let store = "[tasks]\nstore = \"redis://127.0.0.1:1/0\"\n";
    // Records are sealed under the state key: a generated one would make them unreadable to
    // every other replica.
    let (code, err) = run(store);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("tasks.store") && err.contains("[state]"),
        "{err}"
    );
    // Nothing is connected to: an unreachable store is a start-up matter, not a config error.
    let (code, err) = run(&format!("{key}{store}"));
    assert_eq!(code, Some(0), "{err}");
    // The password is read as start-up reads it.
    let missing = dir.join("no-such-password");
    let (code, err) = run(&format!(
        "{key}{store}store_password_file = \"{}\"\n",
        missing.display()
    ));
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("tasks.store_password_file: cannot read"),
        "{err}"
    );
    assert!(!err.contains("[auth]"), "said under the store's key: {err}");
    let (code, err) = run(&format!(
        "{key}{store}store_password_env = \"MRTR_TEST_STORE_PASSWORD\"\n"
    ));
    assert_eq!(code, Some(64), "an unset variable: {err}");
    assert!(
        err.contains("tasks.store_password_env") && err.contains("MRTR_TEST_STORE_PASSWORD"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
