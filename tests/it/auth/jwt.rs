//! `principal = "jwt"`: every bad token is a 401 with the challenge, an unreachable key set a
//! 503, and the key set is fetched once, again when old or for a new `kid`, and for a new `kid`
//! no more often than `jwks_refetch_interval`.

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use http::StatusCode;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use super::{
    challenge, claims, client_posts, client_with, closed_port, jwt_config, list_tools, now, start,
    AuthServer, Key, PRM_URL, RS,
};
use crate::support::mock::Mock;

// `claims(sub)` with `patch` merged in (a `null` removes the claim).
fn patched(patch: Value) -> Value {
    let mut c = claims("alice");
    for (k, v) in patch.as_object().unwrap() {
        match v {
            Value::Null => c.as_object_mut().unwrap().remove(k),
            v => c.as_object_mut().unwrap().insert(k.clone(), v.clone()),
        };
    }
    c
}

// Every bad token, named; `k1` is the published key.
fn bad_tokens(k1: &Key) -> Vec<(&'static str, String)> {
    let b = |t: String| format!("Bearer {t}");
    let hs256 = {
        let mut h = Header::new(Algorithm::HS256);
        h.kid = Some("k1".into());
        jsonwebtoken::encode(&h, &claims("alice"), &EncodingKey::from_secret(b"x")).unwrap()
    };
    let none = {
        let enc = |v: Value| URL_SAFE_NO_PAD.encode(v.to_string());
        format!(
            "{}.{}.",
            enc(json!({"alg":"none","typ":"JWT"})),
            enc(claims("alice"))
        )
    };
    let padding = "p".repeat(2000);
    vec![
        ("garbage", b("not.a.jwt".into())),
        ("not bearer", "Basic YWxpY2U6cHc=".into()),
        (
            "expired",
            b(k1.sign(&patched(json!({"exp": now() - 3600})))),
        ),
        (
            "not yet valid",
            b(k1.sign(&patched(json!({"nbf": now() + 3600})))),
        ),
        (
            "wrong aud",
            b(k1.sign(&patched(json!({"aud": "https://other.example/mcp"})))),
        ),
        (
            "wrong iss",
            b(k1.sign(&patched(json!({"iss": "https://evil.example"})))),
        ),
        ("no sub", b(k1.sign(&patched(json!({"sub": null}))))),
        // Found by the `bearer` fuzz target: it went upstream without the subject header.
        (
            "a subject no header can carry",
            b(k1.sign(&patched(json!({"sub": "al\u{7f}ice"})))),
        ),
        ("no exp", b(k1.sign(&patched(json!({"exp": null}))))),
        ("unknown kid", Key::new("k-unknown").bearer("alice")),
        ("bad signature", Key::new("k1").bearer("alice")),
        ("alg not allowed (HS256)", b(hs256)),
        ("alg none", b(none)),
        ("oversized", b(k1.sign(&patched(json!({"pad": padding}))))),
    ]
}

#[tokio::test]
async fn each_bad_token_is_401_invalid_token_with_the_challenge_and_nothing_goes_upstream() {
    let k1 = Key::new("k1");
    let auth = AuthServer::with(&k1).await;
    let mock = Mock::start().await;
    let extra = format!("{RS}\nmax_token_bytes = \"1KiB\"");
    let proxy = start(&mock, &jwt_config(&auth.jwks_uri(), &extra, "")).await;
    let tail = format!(r#"scope="mcp", resource_metadata="{PRM_URL}""#);
    let mut wrong = Vec::new();
    for (case, authorization) in bad_tokens(&k1) {
        let ex = list_tools(&proxy, &authorization).await;
        let c = ex
            .headers
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap().to_owned());
        let shaped = c.as_deref().is_some_and(|c| {
            c.starts_with(r#"Bearer error="invalid_token", error_description=""#)
                && c.ends_with(&tail)
        });
        if ex.status != StatusCode::UNAUTHORIZED || !shaped || ex.last["error"]["code"] != -32600 {
            wrong.push(format!("{case}: {} {c:?} {}", ex.status, ex.last));
        }
    }
    assert!(
        wrong.is_empty(),
        "not a 401 invalid_token challenge:\n{}",
        wrong.join("\n")
    );
    assert!(client_posts(&mock).is_empty(), "{:#?}", client_posts(&mock));
    let good = list_tools(&proxy, &k1.bearer("alice")).await;
    assert_eq!(
        good.status,
        StatusCode::OK,
        "the good token still works: {:?}",
        good.last
    );
}

#[tokio::test]
async fn a_token_expired_within_the_leeway_is_accepted() {
    let k1 = Key::new("k1");
    let auth = AuthServer::with(&k1).await;
    let mock = Mock::start().await;
    let config = jwt_config(&auth.jwks_uri(), RS, "leeway = \"60s\"");
    let proxy = start(&mock, &config).await;
    let token = k1.sign(&patched(json!({"exp": now() - 20})));
    let ex = list_tools(&proxy, &format!("Bearer {token}")).await;
    assert_eq!(ex.status, StatusCode::OK, "{:?}", ex.last);
}

#[tokio::test]
async fn an_unreachable_key_set_is_503_with_retry_after() {
    let jwks = format!("http://{}/jwks", closed_port().await);
    let mock = Mock::start().await;
    let proxy = start(&mock, &jwt_config(&jwks, RS, "")).await;
    let ex = list_tools(&proxy, &Key::new("k1").bearer("alice")).await;
    assert_eq!(ex.status, StatusCode::SERVICE_UNAVAILABLE, "{:?}", ex.last);
    assert!(ex.headers.contains_key("retry-after"), "{:?}", ex.headers);
    assert!(
        ex.last["error"].is_object(),
        "a JSON-RPC error: {:?}",
        ex.last
    );
    assert!(client_posts(&mock).is_empty(), "{:#?}", client_posts(&mock));
}

// Lets `d` pass on the proxy's clock (tokio's), with nothing in flight.
async fn pass(d: Duration) {
    tokio::time::pause();
    tokio::time::advance(d).await;
    tokio::time::resume();
}

#[tokio::test]
async fn a_rotated_key_is_fetched_once_and_then_accepted() {
    let (k1, k2) = (Key::new("k1"), Key::new("k2"));
    let auth = AuthServer::with(&k1).await;
    let mock = Mock::start().await;
    let config = jwt_config(&auth.jwks_uri(), RS, "jwks_refetch_interval = \"5s\"");
    let proxy = start(&mock, &config).await;
    assert_eq!(
        list_tools(&proxy, &k1.bearer("alice")).await.status,
        StatusCode::OK
    );
    assert_eq!(auth.jwks_fetches(), 1);
    pass(Duration::from_secs(6)).await;
    auth.publish(&[&k1, &k2]);
    for _ in 0..3 {
        let ex = list_tools(&proxy, &k2.bearer("alice")).await;
        assert_eq!(ex.status, StatusCode::OK, "{:?}", ex.last);
    }
    assert_eq!(
        auth.jwks_fetches(),
        2,
        "one refetch for the new kid, then cached"
    );
    let ex = list_tools(&proxy, &k1.bearer("alice")).await;
    assert_eq!(ex.status, StatusCode::OK, "the old key still in the set");
    assert_eq!(auth.jwks_fetches(), 2);
}

#[tokio::test]
async fn a_second_unknown_kid_within_the_refetch_interval_is_refused_without_a_fetch() {
    let (k1, k2, k3) = (Key::new("k1"), Key::new("k2"), Key::new("k3"));
    let auth = AuthServer::with(&k1).await;
    let mock = Mock::start().await;
    let config = jwt_config(&auth.jwks_uri(), RS, "jwks_refetch_interval = \"5s\"");
    let proxy = start(&mock, &config).await;
    assert_eq!(
        list_tools(&proxy, &k1.bearer("alice")).await.status,
        StatusCode::OK
    );
    pass(Duration::from_secs(6)).await;
    auth.publish(&[&k2]);
    assert_eq!(
        list_tools(&proxy, &k2.bearer("alice")).await.status,
        StatusCode::OK
    );
    assert_eq!(auth.jwks_fetches(), 2);
    // Rotated again at once: the next unknown kid is inside the interval.
    auth.publish(&[&k2, &k3]);
    let ex = list_tools(&proxy, &k3.bearer("alice")).await;
    assert_eq!(ex.status, StatusCode::UNAUTHORIZED, "{:?}", ex.last);
    assert!(
        challenge(&ex).contains(r#"error="invalid_token""#),
        "{}",
        challenge(&ex)
    );
    assert_eq!(auth.jwks_fetches(), 2, "rate-limited: no fetch");
    // Once the interval has passed, the same kid is fetched and accepted.
    pass(Duration::from_secs(6)).await;
    let ex = list_tools(&proxy, &k3.bearer("alice")).await;
    assert_eq!(ex.status, StatusCode::OK, "{:?}", ex.last);
    assert_eq!(auth.jwks_fetches(), 3);
}

#[tokio::test]
async fn concurrent_first_requests_fetch_the_key_set_once() {
    let k1 = Key::new("k1");
    let auth = AuthServer::with(&k1).await;
    let mock = Mock::start().await;
    let proxy = start(&mock, &jwt_config(&auth.jwks_uri(), RS, "")).await;
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let c = client_with(&proxy, &k1.bearer("alice"));
        calls.spawn(async move { c.request("tools/list", json!({})).await.unwrap().status });
    }
    while let Some(status) = calls.join_next().await {
        assert_eq!(status.unwrap(), StatusCode::OK);
    }
    assert_eq!(
        auth.jwks_fetches(),
        1,
        "the others waited for the one fetch"
    );
}

#[tokio::test]
async fn a_key_set_older_than_jwks_max_age_is_fetched_again() {
    let k1 = Key::new("k1");
    let auth = AuthServer::with(&k1).await;
    let mock = Mock::start().await;
    let jwt = "jwks_max_age = \"5s\"\njwks_refetch_interval = \"1s\"";
    let proxy = start(&mock, &jwt_config(&auth.jwks_uri(), RS, jwt)).await;
    assert_eq!(
        list_tools(&proxy, &k1.bearer("alice")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        list_tools(&proxy, &k1.bearer("alice")).await.status,
        StatusCode::OK
    );
    assert_eq!(auth.jwks_fetches(), 1, "fresh: not fetched again");
    pass(Duration::from_secs(6)).await;
    assert_eq!(
        list_tools(&proxy, &k1.bearer("alice")).await.status,
        StatusCode::OK
    );
    assert_eq!(auth.jwks_fetches(), 2, "old: fetched again");
}
