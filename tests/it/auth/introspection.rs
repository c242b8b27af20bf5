//! `principal = "introspection"`: opaque tokens checked at the RFC 7662 endpoint; active answers
//! cached by token, inactive ones 401 (and cached for `negative_cache_max_age`), an unreachable
//! endpoint or one past the rate bound 503.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use http::StatusCode;
use serde_json::{json, Value};

use super::{
    answers, challenge, client_posts, client_with, closed_port, introspection_config, list_tools,
    now, script_ask, start, AuthServer, ISSUER, PRM_URL, RESOURCE, RS,
};
use crate::metrics::sample;
use crate::support::mock::Mock;
use crate::support::{first_round, retry, TestProxy};

const SKIPPED: &str = "mrtr_auth_introspections_skipped_total";

fn active(sub: &str) -> Value {
    json!({"active": true, "sub": sub, "iss": ISSUER, "aud": RESOURCE, "scope": "mcp",
           "exp": now() + 600})
}

async fn proxy_of(mock: &Mock, auth: &AuthServer, extra: &str) -> TestProxy {
    let config = introspection_config(&auth.introspection_uri(), RS, extra);
    start(mock, &config).await
}

#[tokio::test]
async fn an_active_token_is_asked_once_and_then_served_from_the_cache() {
    let auth = AuthServer::start().await;
    auth.answer("tokA", active("alice"));
    auth.answer("tokB", active("bob"));
    let mock = Mock::start().await;
    let proxy = proxy_of(&mock, &auth, "").await;
    for _ in 0..2 {
        assert_eq!(
            list_tools(&proxy, "Bearer tokA").await.status,
            StatusCode::OK
        );
    }
    assert_eq!(auth.introspected().len(), 1, "{:?}", auth.introspected());
    assert_eq!(
        list_tools(&proxy, "Bearer tokB").await.status,
        StatusCode::OK
    );
    let asked: Vec<String> = auth.introspected().into_iter().map(|(t, _)| t).collect();
    assert_eq!(asked, ["tokA", "tokB"], "each token asked once");
}

#[tokio::test]
async fn an_inactive_token_is_401_invalid_token_and_asked_once_while_cached() {
    let auth = AuthServer::start().await;
    auth.answer("revoked", json!({"active": false}));
    let mock = Mock::start().await;
    let proxy = proxy_of(&mock, &auth, "").await;
    for _ in 0..2 {
        let ex = list_tools(&proxy, "Bearer revoked").await;
        assert_eq!(ex.status, StatusCode::UNAUTHORIZED, "{:?}", ex.last);
        let c = challenge(&ex);
        assert!(c.starts_with(r#"Bearer error="invalid_token""#), "{c}");
        assert!(c.contains("not active"), "the cached refusal says why: {c}");
        assert!(
            c.ends_with(&format!(r#"resource_metadata="{PRM_URL}""#)),
            "{c}"
        );
    }
    assert_eq!(
        auth.introspected().len(),
        1,
        "the refusal is cached for negative_cache_max_age (30s)"
    );
    assert!(client_posts(&mock).is_empty(), "{:#?}", client_posts(&mock));
    let metrics = proxy.get_text("/metrics").await;
    let hits = format!(r#"{SKIPPED}{{reason="negative_cache"}}"#);
    assert_eq!(sample(&metrics, &hits), 1.0, "{metrics}");
}

#[tokio::test]
async fn a_zero_negative_cache_max_age_asks_every_time() {
    let auth = AuthServer::start().await;
    let mock = Mock::start().await;
    let proxy = proxy_of(&mock, &auth, "negative_cache_max_age = \"0s\"").await;
    for _ in 0..2 {
        let ex = list_tools(&proxy, "Bearer unknown").await;
        assert_eq!(ex.status, StatusCode::UNAUTHORIZED, "{:?}", ex.last);
    }
    assert_eq!(auth.introspected().len(), 2);
}

#[tokio::test]
async fn a_cached_refusal_is_asked_again_once_it_expires() {
    let auth = AuthServer::start().await;
    let mock = Mock::start().await;
    let proxy = proxy_of(&mock, &auth, "negative_cache_max_age = \"50ms\"").await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    // Asked once, then answered from the cache until the entry expires: the endpoint sees the
    // token a second time only after that.
    while auth.introspected().len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never asked again: {:?}",
            auth.introspected()
        );
        let ex = list_tools(&proxy, "Bearer unknown").await;
        assert_eq!(ex.status, StatusCode::UNAUTHORIZED, "{:?}", ex.last);
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(auth.introspected().iter().all(|(t, _)| t == "unknown"));
}

#[tokio::test]
async fn past_the_rate_bound_a_token_is_503_and_the_server_is_not_asked() {
    const BURST: usize = 3;
    const TOKENS: usize = 12;
    let auth = AuthServer::start().await;
    auth.answer("tokA", active("alice"));
    let mock = Mock::start().await;
    let extra = format!("max_rate = 1\nmax_burst = {BURST}");
    let proxy = proxy_of(&mock, &auth, &extra).await;
    let started = std::time::Instant::now();
    assert_eq!(
        list_tools(&proxy, "Bearer tokA").await.status,
        StatusCode::OK
    );
    let mut unavailable = 0;
    for i in 0..TOKENS {
        let ex = list_tools(&proxy, &format!("Bearer made-up-{i}")).await;
        match ex.status {
            StatusCode::UNAUTHORIZED => {}
            StatusCode::SERVICE_UNAVAILABLE => {
                assert!(ex.headers.contains_key("retry-after"), "{:?}", ex.headers);
                unavailable += 1;
            }
            other => panic!("{other}: {:?}", ex.last),
        }
    }
    // The bucket's worth (its burst, refilled at 1 a second meanwhile), never one per token.
    let refilled = usize::try_from(started.elapsed().as_secs()).unwrap();
    let asked = auth.introspected().len();
    assert!(
        asked <= BURST + refilled,
        "{asked} asked in {:?}",
        started.elapsed()
    );
    assert_eq!(
        asked + unavailable,
        TOKENS + 1,
        "each token asked or refused"
    );
    assert!(unavailable > 0);
    assert_eq!(
        list_tools(&proxy, "Bearer tokA").await.status,
        StatusCode::OK,
        "a cached active token needs no request"
    );
    assert_eq!(auth.introspected().len(), asked);
    let metrics = proxy.get_text("/metrics").await;
    let bound = format!(r#"{SKIPPED}{{reason="rate_bound"}}"#);
    assert_eq!(sample(&metrics, &bound), unavailable as f64, "{metrics}");
    let refused = r#"mrtr_auth_refusals_total{reason="unavailable"}"#;
    assert_eq!(sample(&metrics, refused), unavailable as f64);
}

#[tokio::test]
async fn a_token_for_another_resource_is_401() {
    let auth = AuthServer::start().await;
    let mut other = active("alice");
    other["aud"] = json!("https://other.example/mcp");
    auth.answer("elsewhere", other);
    let mock = Mock::start().await;
    let proxy = proxy_of(&mock, &auth, "").await;
    let ex = list_tools(&proxy, "Bearer elsewhere").await;
    assert_eq!(ex.status, StatusCode::UNAUTHORIZED, "{:?}", ex.last);
    assert!(challenge(&ex).contains(r#"error="invalid_token""#));
}

#[tokio::test]
async fn an_unreachable_introspection_endpoint_is_503_with_retry_after() {
    let endpoint = format!("http://{}/introspect", closed_port().await);
    let mock = Mock::start().await;
    let config = introspection_config(&endpoint, RS, "");
    let proxy = start(&mock, &config).await;
    let ex = list_tools(&proxy, "Bearer tokA").await;
    assert_eq!(ex.status, StatusCode::SERVICE_UNAVAILABLE, "{:?}", ex.last);
    assert!(ex.headers.contains_key("retry-after"), "{:?}", ex.headers);
    assert!(client_posts(&mock).is_empty(), "{:#?}", client_posts(&mock));
}

#[tokio::test]
async fn the_proxy_authenticates_itself_to_the_introspection_endpoint() {
    let auth = AuthServer::start().await;
    auth.answer("tokA", active("alice"));
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let secret = dir.join("auth-introspection-secret");
    std::fs::write(&secret, "s3cret\n").unwrap();
    let extra = format!(
        "client_id = \"proxy\"\nclient_secret_file = \"{}\"",
        secret.display()
    );
    let mock = Mock::start().await;
    let proxy = proxy_of(&mock, &auth, &extra).await;
    assert_eq!(
        list_tools(&proxy, "Bearer tokA").await.status,
        StatusCode::OK
    );
    let basic = format!("Basic {}", STANDARD.encode("proxy:s3cret"));
    assert_eq!(auth.introspected(), [("tokA".to_owned(), Some(basic))]);
}

#[tokio::test]
async fn a_new_token_of_the_same_subject_resumes_the_call() {
    let auth = AuthServer::start().await;
    auth.answer("first", active("alice"));
    auth.answer("second", active("alice"));
    let mock = Mock::start().await;
    script_ask(&mock);
    let proxy = proxy_of(&mock, &auth, "").await;
    let (_, state) = first_round(&client_with(&proxy, "Bearer first"), "ask", json!({})).await;
    let c = client_with(&proxy, "Bearer second");
    let ex = retry(&c, "ask", json!({}), answers(), &state).await;
    assert_eq!(ex.result()["resultType"], "complete", "{:?}", ex.last);
    assert_eq!(mock.calls_of("ask"), 1);
}

#[tokio::test]
async fn the_same_subject_from_another_issuer_is_another_principal() {
    let auth = AuthServer::start().await;
    auth.answer("ours", active("alice"));
    let mut theirs = active("alice");
    theirs["iss"] = json!("https://other-issuer.example");
    auth.answer("theirs", theirs);
    let mock = Mock::start().await;
    script_ask(&mock);
    let proxy = proxy_of(&mock, &auth, "").await;
    let (_, state) = first_round(&client_with(&proxy, "Bearer ours"), "ask", json!({})).await;
    let c = client_with(&proxy, "Bearer theirs");
    let ex = retry(&c, "ask", json!({}), answers(), &state).await;
    assert_eq!(ex.status, StatusCode::BAD_REQUEST, "{:?}", ex.last);
    assert_eq!(ex.last["error"]["code"], -32602);
    assert!(mock.answers_to(1).is_empty());
}
