//! Pass-through (`principal = "jwt"`, `require = false`): the upstream does its own auth, the
//! principal is the token's subject, and each leg's own token is what goes upstream. With
//! `resource` set, the upstream's metadata and challenges name the proxy's public URL. Header
//! mode (no `[auth]`) behaves as before.

use http::StatusCode;
use serde_json::json;

use super::{
    answers, challenge, client_posts, client_with, get_json, header_of, jwt_config, list_tools,
    script_ask, start, AuthServer, Key, PRM_URL, RESOURCE,
};
use crate::support::mock::{Mock, CHALLENGE};
use crate::support::{error_of, first_round, retry};

#[tokio::test]
async fn a_refreshed_token_resumes_the_call_and_the_answer_goes_upstream_with_it() {
    let key = Key::new("k1");
    let auth = AuthServer::with(&key).await;
    let mock = Mock::start().await;
    script_ask(&mock);
    let proxy = start(&mock, &jwt_config(&auth.jwks_uri(), "", "")).await;
    let (first, refreshed) = (key.bearer("alice"), key.bearer("alice"));
    assert_ne!(first, refreshed);
    let (_, state) = first_round(&client_with(&proxy, &first), "ask", json!({})).await;
    let c = client_with(&proxy, &refreshed);
    let ex = retry(&c, "ask", json!({}), answers(), &state).await;
    assert_eq!(ex.result()["resultType"], "complete", "{:?}", ex.last);
    assert_eq!(mock.calls_of("ask"), 1, "resumed, not run again");
    let call = header_of(&mock, "authorization", |m| m["method"] == "tools/call");
    assert_eq!(
        call,
        [Some(first)],
        "the call went up with the first leg's token"
    );
    let answer = header_of(&mock, "authorization", |m| {
        m.get("method").is_none() && m["id"] == 1
    });
    assert_eq!(
        answer,
        [Some(refreshed)],
        "the answer went up with the retry's token"
    );
}

#[tokio::test]
async fn another_subjects_token_cannot_resume_the_call() {
    let key = Key::new("k1");
    let auth = AuthServer::with(&key).await;
    let mock = Mock::start().await;
    script_ask(&mock);
    let proxy = start(&mock, &jwt_config(&auth.jwks_uri(), "", "")).await;
    let alice = client_with(&proxy, &key.bearer("alice"));
    let (_, state) = first_round(&alice, "ask", json!({})).await;
    let bob = client_with(&proxy, &key.bearer("bob"));
    let ex = retry(&bob, "ask", json!({}), answers(), &state).await;
    assert_eq!(ex.status, StatusCode::BAD_REQUEST);
    assert_eq!(error_of(&ex)["code"], -32602);
    let msg = error_of(&ex)["message"].as_str().unwrap();
    assert!(msg.contains("another principal"), "{msg}");
    assert!(
        mock.answers_to(1).is_empty(),
        "nothing reached the upstream"
    );
    let ex = retry(&alice, "ask", json!({}), answers(), &state).await;
    assert_eq!(
        ex.result()["resultType"],
        "complete",
        "alice still can: {:?}",
        ex.last
    );
}

#[tokio::test]
async fn a_token_given_in_pass_through_is_still_verified() {
    let key = Key::new("k1");
    let auth = AuthServer::with(&key).await;
    let mock = Mock::start().await;
    let proxy = start(&mock, &jwt_config(&auth.jwks_uri(), "", "")).await;
    let ex = list_tools(&proxy, &Key::new("k1").bearer("alice")).await;
    assert_eq!(ex.status, StatusCode::UNAUTHORIZED, "{:?}", ex.last);
    assert!(challenge(&ex).starts_with(r#"Bearer error="invalid_token""#));
    assert!(client_posts(&mock).is_empty(), "{:#?}", client_posts(&mock));
}

#[tokio::test]
async fn the_upstreams_metadata_is_relayed_with_the_public_resource_at_both_paths() {
    let auth = AuthServer::with(&Key::new("k1")).await;
    let mock = Mock::start().await;
    let proxy = start(&mock, &jwt_config(&auth.jwks_uri(), "", "")).await;
    for path in [
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
    ] {
        let (status, _, doc) = get_json(&proxy, path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(doc["resource"], RESOURCE, "{path}: {doc}");
        assert_eq!(
            doc["authorization_servers"],
            json!(["http://auth.example"]),
            "{path}"
        );
    }
}

#[tokio::test]
async fn the_upstreams_challenge_names_the_proxys_public_metadata() {
    let key = Key::new("k1");
    let auth = AuthServer::with(&key).await;
    let mock = Mock::start().await;
    let proxy = start(&mock, &jwt_config(&auth.jwks_uri(), "", "")).await;
    mock.require_auth("Bearer only-this");
    let anonymous = proxy.client(json!({}));
    let without = anonymous.request("tools/list", json!({})).await.unwrap();
    let with = list_tools(&proxy, &key.bearer("alice")).await;
    for (case, ex) in [("no token", without), ("a token it refuses", with)] {
        assert_eq!(ex.status, StatusCode::UNAUTHORIZED, "{case}: {:?}", ex.last);
        let expected = format!(r#"Bearer resource_metadata="{PRM_URL}""#);
        assert_eq!(challenge(&ex), expected, "{case}");
    }
}

#[tokio::test]
async fn header_mode_forwards_the_header_unverified_and_relays_metadata_unchanged() {
    let mock = Mock::start().await;
    let proxy = start(&mock, "").await;
    let ex = list_tools(&proxy, "Bearer not-a-jwt").await;
    assert_eq!(ex.status, StatusCode::OK, "{:?}", ex.last);
    let seen = header_of(&mock, "authorization", |m| m["method"] == "tools/list");
    assert_eq!(seen, [Some("Bearer not-a-jwt".to_owned())]);
    let (status, _, doc) = get_json(&proxy, "/.well-known/oauth-protected-resource/mcp").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(doc["resource"], "http://mock/mcp", "untouched: {doc}");
    mock.require_auth("Bearer good");
    let ex = list_tools(&proxy, "Bearer bad").await;
    assert_eq!(ex.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        challenge(&ex),
        CHALLENGE,
        "the upstream's challenge as it was"
    );
}
