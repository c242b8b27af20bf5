//! `[auth]` combinations the proxy refuses at start, naming the key.

use mrtr_proxy::config::{Config, ConfigError};

use super::{jwt_config, RS};

// The key a config with `auth` is refused for.
fn refused_key(auth: &str) -> &'static str {
    let text = format!("[upstream]\nurl = \"http://127.0.0.1:9/mcp\"\n{auth}");
    match Config::from_toml_str(&text) {
        Err(ConfigError::Invalid { key, .. }) => key,
        other => panic!("expected a refusal of\n{auth}\ngot {other:?}"),
    }
}

const JWKS: &str = "https://as.example/jwks";

#[test]
fn resource_server_mode_without_a_verified_principal_is_refused() {
    let auth = "[auth]\nrequire = true\nresource = \"https://mcp.example.com/mcp\"\n\
                authorization_servers = [\"https://as.example\"]\n";
    assert_eq!(refused_key(auth), "auth.require");
}

#[test]
fn an_hmac_algorithm_is_refused() {
    let auth = jwt_config(JWKS, RS, "").replace("[\"EdDSA\"]", "[\"HS256\"]");
    assert_eq!(refused_key(&auth), "auth.jwt.algorithms");
}

#[test]
fn a_verified_principal_without_a_resource_is_refused() {
    let auth = jwt_config(JWKS, "", "").replace("resource =", "# resource =");
    assert_eq!(refused_key(&auth), "auth.resource");
}

#[test]
fn resource_server_mode_without_an_authorization_server_is_refused() {
    let auth = jwt_config(JWKS, RS, "").replace("authorization_servers =", "# =");
    assert_eq!(refused_key(&auth), "auth.authorization_servers");
}

#[test]
fn the_configs_these_tests_use_are_accepted() {
    for auth in [jwt_config(JWKS, RS, ""), jwt_config(JWKS, "", "")] {
        let text = format!("[upstream]\nurl = \"http://127.0.0.1:9/mcp\"\n{auth}");
        assert!(Config::from_toml_str(&text).is_ok(), "{auth}");
    }
}

#[test]
fn forward_authorization_outside_resource_server_mode_is_refused() {
    let auth = jwt_config(JWKS, "forward_authorization = true", "");
    assert_eq!(refused_key(&auth), "auth.forward_authorization");
}

#[test]
fn a_subject_header_without_a_verified_principal_is_refused() {
    assert_eq!(
        refused_key("[auth]\nsubject_header = \"x-mcp-subject\"\n"),
        "auth.subject_header"
    );
}

#[test]
fn tool_scopes_outside_resource_server_mode_are_refused() {
    let auth = format!(
        "{}[auth.scopes]\nadmin = [\"admin\"]\n",
        jwt_config(JWKS, "", "")
    );
    assert_eq!(refused_key(&auth), "auth.scopes");
}
