//! The requestState key set through the whole proxy: ES256 and EdDSA keys from PEM files, and a
//! reload (what SIGHUP does) that rotates the key with a call parked and loses nothing.

use std::path::PathBuf;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde_json::{json, Value};

use crate::support::mock::{Mock, Step};
use crate::support::{all_caps, first_round, retry, TestProxy};

/// A file of this test's own under the system temp dir, removed when dropped.
struct KeyFile(PathBuf);

impl KeyFile {
    fn new(name: &str, text: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "mrtr-proxy-test-{}-{name}-{}",
            std::process::id(),
            URL_SAFE_NO_PAD.encode(rand_bytes())
        ));
        std::fs::write(&path, text).unwrap();
        Self(path)
    }

    fn write(&self, text: &str) {
        std::fs::write(&self.0, text).unwrap();
    }

    fn toml_path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn rand_bytes() -> [u8; 9] {
    let mut b = [0u8; 9];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b).unwrap();
    b
}

fn pkcs8_pem(der: &[u8]) -> String {
    pem::encode(&pem::Pem::new("PRIVATE KEY", der.to_vec()))
}

fn p256_pem() -> String {
    let rng = ring::rand::SystemRandom::new();
    pkcs8_pem(
        EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .unwrap()
            .as_ref(),
    )
}

fn ed25519_pem() -> String {
    let rng = ring::rand::SystemRandom::new();
    pkcs8_pem(Ed25519KeyPair::generate_pkcs8(&rng).unwrap().as_ref())
}

/// A tool that asks twice, then answers.
fn two_rounds(mock: &Mock) {
    mock.script(
        "ask",
        vec![vec![
            Step::elicit(1),
            Step::Await(1),
            Step::elicit(2),
            Step::Await(2),
            Step::Reply(json!({"content":[{"type":"text","text":"done"}]})),
        ]],
    );
}

fn header(token: &str) -> Value {
    let head = token.split('.').next().unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(head).unwrap()).unwrap()
}

fn answer(n: u32) -> Value {
    json!({ format!("elicitation-{n}"): {"action":"accept","content":{}} })
}

#[tokio::test]
async fn es256_and_eddsa_key_files_sign_rounds_that_complete() {
    for (alg, pem) in [("ES256", p256_pem()), ("EdDSA", ed25519_pem())] {
        let mock = Mock::start().await;
        two_rounds(&mock);
        let key = KeyFile::new("key.pem", &pem);
        let toml = format!("[state]\nsecret_file = \"{}\"\n", key.toml_path());
        let proxy = TestProxy::start(&mock.url(), &toml).await;
        let c = proxy.client(all_caps());
        let (_, state) = first_round(&c, "ask", json!({})).await;
        assert_eq!(header(&state)["alg"], alg);
        assert_eq!(header(&state)["kid"], proxy.app.key_ids()[0]);
        let ex = retry(&c, "ask", json!({}), answer(1), &state).await;
        let state = ex.result()["requestState"].as_str().unwrap().to_owned();
        let ex = retry(&c, "ask", json!({}), answer(2), &state).await;
        assert_eq!(ex.result()["content"][0]["text"], "done", "{alg}");
    }
}

#[tokio::test]
async fn a_reload_rotates_the_key_while_a_call_is_parked_and_nothing_is_lost() {
    let mock = Mock::start().await;
    two_rounds(&mock);
    let key = KeyFile::new("rotating", "an-hs256-secret-of-at-least-32-bytes!!");
    let toml = format!("[state]\nsecret_file = \"{}\"\n", key.toml_path());
    let proxy = TestProxy::start(&mock.url(), &toml).await;
    let c = proxy.client(all_caps());
    let (_, old_state) = first_round(&c, "ask", json!({})).await;
    let old_kid = proxy.app.key_ids()[0].clone();
    assert_eq!(header(&old_state)["kid"], old_kid.as_str());

    // Rotate to an ES256 key (what SIGHUP does): the parked round's token still verifies, and
    // the next round is signed with the new key.
    key.write(&p256_pem());
    let new_kid = proxy.app.reload_keys().unwrap();
    assert_ne!(new_kid, old_kid);
    assert_eq!(proxy.app.key_ids(), vec![new_kid.clone(), old_kid.clone()]);
    assert_eq!(
        proxy.app.parked_calls(),
        1,
        "the parked call survived the reload"
    );
    let ex = retry(&c, "ask", json!({}), answer(1), &old_state).await;
    let state = ex.result()["requestState"].as_str().unwrap().to_owned();
    assert_eq!(header(&state)["alg"], "ES256");
    assert_eq!(header(&state)["kid"], new_kid.as_str());

    // A broken file is refused and the keys in use stay.
    key.write("-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n");
    let err = proxy.app.reload_keys().unwrap_err().to_string();
    assert!(err.contains("state.secret_file"), "{err}");
    assert!(
        !err.contains("garbage"),
        "the message names the file, not its content"
    );
    assert_eq!(proxy.app.key_ids(), vec![new_kid, old_kid]);
    let ex = retry(&c, "ask", json!({}), answer(2), &state).await;
    assert_eq!(ex.result()["content"][0]["text"], "done");

    let metrics = proxy.get_text("/metrics").await;
    assert!(
        metrics.contains("mrtr_key_reloads_total{result=\"ok\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("mrtr_key_reloads_total{result=\"error\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_key_file_that_cannot_be_used_stops_start_up_with_its_name() {
    let key = KeyFile::new(
        "public",
        "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
    );
    let toml = format!(
        "[upstream]\nurl = \"http://127.0.0.1:9/mcp\"\n[state]\nsecret_file = \"{}\"\n",
        key.toml_path()
    );
    let config = mrtr_proxy::config::Config::from_toml_str(&toml).unwrap();
    let err = mrtr_proxy::app::App::new(config).unwrap_err().to_string();
    assert!(err.contains(&key.toml_path()), "{err}");
    assert!(err.contains("give the private key"), "{err}");
}
