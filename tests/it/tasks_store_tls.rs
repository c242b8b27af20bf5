//! The shared task store over TLS (`rediss://`), against a real `redis-server` that speaks only
//! TLS with a certificate of a private CA: trusted through `tasks.store_ca_file`, refused when
//! that CA did not sign it, and mutual TLS (`tls-auth-clients yes`) with `store_cert_file` +
//! `store_key_file`. A store that TLS refuses is a store down: calls stay ordinary calls.

use std::path::Path;
use std::process::{Command, Stdio};

use mrtr_proxy::app::App;
use mrtr_proxy::config::Config;
use serde_json::json;

use crate::metrics::sample;
use crate::smoke::{terminate, Running, Stderr};
use crate::support::mock::{Mock, Step};
use crate::support::pki::Pki;
use crate::support::redis_server::RedisServer;
use crate::support::TestProxy;
use crate::tasks::{setup, start_task, task_caps, until_status};
use crate::tasks_store::stays_ordinary_with_the_store_down;

const KEY: &str = "a-shared-cluster-key-0123456789abcdef";

/// `[state]` and `[tasks]` for a store at `url` with `tls` keys (`name = "path"` lines).
fn config(url: &str, tls: &[(&str, &Path)]) -> String {
    let keys: String = tls
        .iter()
        .map(|(k, p)| format!("{k} = \"{}\"\n", p.display()))
        .collect();
    format!(
        "[state]\nsecret = \"{KEY}\"\n[server]\nshutdown_grace = \"100ms\"\n\
         [tasks]\nstore = \"{url}\"\nstore_timeout = \"500ms\"\nlease = \"2s\"\n{keys}\
         [tasks.tools]\nslow = \"always\"\n"
    )
}

/// A replica on the store at `url` (TLS keys `tls`) whose `slow` asks, then finishes.
async fn replica(url: &str, tls: &[(&str, &Path)]) -> (Mock, TestProxy) {
    let done = Step::Reply(json!({"content": [{"type": "text", "text": "done"}]}));
    let script = vec![Step::elicit(7), Step::Await(7), done];
    setup("slow", script, &config(url, tls)).await
}

async fn metric(proxy: &TestProxy, series: &str) -> f64 {
    sample(&proxy.get_text("/metrics").await, series)
}

/// A task made on one replica and read from the store on another (which has no peers, so
/// what it answers comes from the store), both trusting `tls`; the record is in the store.
async fn a_task_goes_through(store: &RedisServer, tls: &[(&str, &Path)]) {
    let (_m1, a) = replica(&store.url(), tls).await;
    let (_m2, b) = replica(&store.url(), tls).await;
    let id = start_task(&a.client(task_caps()), "slow").await;
    let asked = until_status(&b.client(task_caps()), &id, "input_required").await;
    assert_eq!(asked["taskId"], id.as_str(), "{asked}");
    let mut conn = store.connection().await.unwrap();
    let stored: bool = redis::cmd("EXISTS")
        .arg(format!("mrtr:task:{id}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(stored, "the record is in the TLS store");
    assert_eq!(metric(&a, "mrtr_task_store_up").await, 1.0);
}

/// A proxy on the store at `url` with `tls` keys finds the store down.
async fn the_store_is_refused(url: &str, tls: &[(&str, &Path)]) {
    let done = Step::Reply(json!({"content": [{"type": "text", "text": "done"}]}));
    let (_mock, proxy) = setup("slow", vec![done], &config(url, tls)).await;
    stays_ordinary_with_the_store_down(&proxy, "done").await;
}

#[tokio::test]
async fn a_task_is_created_and_read_over_tls_trusting_the_private_ca_of_store_ca_file() {
    let pki = Pki::new();
    let store = RedisServer::start_tls(&pki, "server", false).await;
    let ca = pki.file("ca.pem");
    a_task_goes_through(&store, &[("store_ca_file", &ca)]).await;
}

#[tokio::test]
async fn a_store_whose_certificate_the_trusted_ca_did_not_sign_is_refused() {
    let pki = Pki::new();
    let store = RedisServer::start_tls(&pki, "server", false).await;
    let other = Pki::new();
    // Another private CA, and the public roots (no store_ca_file): neither signed it.
    the_store_is_refused(&store.url(), &[("store_ca_file", &other.file("ca.pem"))]).await;
    the_store_is_refused(&store.url(), &[]).await;
}

#[tokio::test]
async fn a_store_refused_from_the_start_is_logged_with_why() {
    // The binary, so that its log can be read: the store is down from the first check (it was
    // never up, so nothing "changed"), and the warning names the certificate's fault.
    let (pki, other) = (Pki::new(), Pki::new());
    let store = RedisServer::start_tls(&pki, "server", false).await;
    let toml = format!(
        "[upstream]\nurl = \"http://127.0.0.1:9/mcp\"\n{}",
        config(&store.url(), &[("store_ca_file", &other.file("ca.pem"))])
    );
    let file = pki.file("proxy.toml");
    std::fs::write(&file, toml).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_mrtr-proxy"))
        .args(["--listen", "127.0.0.1:0", "--config"])
        .arg(&file)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = Stderr::of(&mut child);
    let child = Running(Some(child));
    let line = stderr.wait_for("task store unreachable");
    assert!(line.contains("UnknownIssuer"), "{line}");
    assert!(terminate(child.take()).await.success());
}

#[tokio::test]
async fn a_certificate_the_ca_signed_for_another_name_is_refused() {
    let pki = Pki::new();
    let store = RedisServer::start_tls(&pki, "stranger", false).await;
    the_store_is_refused(&store.url(), &[("store_ca_file", &pki.file("ca.pem"))]).await;
}

#[tokio::test]
async fn mutual_tls_takes_the_client_certificate_and_a_store_that_asks_for_one_refuses_none() {
    let pki = Pki::new();
    let store = RedisServer::start_tls(&pki, "server", true).await;
    let (ca, cert, key) = (
        pki.file("ca.pem"),
        pki.file("client.pem"),
        pki.file("client.key"),
    );
    let mutual = [
        ("store_ca_file", ca.as_path()),
        ("store_cert_file", &cert),
        ("store_key_file", &key),
    ];
    a_task_goes_through(&store, &mutual).await;
    the_store_is_refused(&store.url(), &[("store_ca_file", &ca)]).await;
}

#[tokio::test]
async fn an_unreadable_tls_file_fails_start_up_and_check_config_naming_the_key_and_path() {
    let pki = Pki::new();
    let missing = pki.file("no-such-ca.pem");
    let key = pki.file("client.key");
    let cases = [
        (
            vec![("store_ca_file", missing.as_path())],
            "tasks.store_ca_file",
            "no-such-ca.pem",
        ),
        // A private key where the CA certificates should be: named, its contents never shown.
        (
            vec![("store_ca_file", key.as_path())],
            "tasks.store_ca_file",
            "client.key",
        ),
    ];
    let secret = std::fs::read_to_string(&key).unwrap();
    let secret_line = secret.lines().nth(1).unwrap();
    for (tls, name, path) in cases {
        let toml = format!(
            "[upstream]\nurl = \"http://127.0.0.1:9/mcp\"\n{}",
            config("rediss://127.0.0.1:6380/0", &tls)
        );
        let e = App::new(Config::from_toml_str(&toml).unwrap()).unwrap_err();
        let e = e.to_string();
        assert!(e.contains(name) && e.contains(path), "{e}");
        assert!(!e.contains(secret_line), "{e}");
        let file = pki.file("proxy.toml");
        std::fs::write(&file, &toml).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_mrtr-proxy"))
            .arg("check-config")
            .arg(&file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{stderr}");
        assert!(stderr.contains(name) && stderr.contains(path), "{stderr}");
        assert!(!stderr.contains(secret_line), "{stderr}");
    }
}

#[test]
fn check_config_passes_readable_tls_files() {
    let pki = Pki::new();
    let tls = [
        ("store_ca_file", pki.file("ca.pem")),
        ("store_cert_file", pki.file("client.pem")),
        ("store_key_file", pki.file("client.key")),
    ];
    let tls: Vec<(&str, &Path)> = tls.iter().map(|(k, p)| (*k, p.as_path())).collect();
    let toml = format!(
        "[upstream]\nurl = \"http://127.0.0.1:9/mcp\"\n{}",
        config("rediss://127.0.0.1:6380/0", &tls)
    );
    let file = pki.file("proxy.toml");
    std::fs::write(&file, toml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mrtr-proxy"))
        .arg("check-config")
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}
