//! `[auth]` as parsed and validated: what each mode needs, and the key each refusal names.

use super::*;

fn auth(toml: &str) -> Result<Auth, ConfigError> {
    let raw: RawAuth = toml::from_str(toml).unwrap();
    Auth::from_raw(raw)
}

const JWT: &str = r#"
    principal = "jwt"
    resource = "https://mcp.example.com/mcp"
    authorization_servers = ["https://auth.example.com"]
    [jwt]
    issuer = "https://auth.example.com"
    jwks_uri = "https://auth.example.com/jwks"
"#;

#[test]
fn defaults_are_header_pass_through() {
    let a = auth("").unwrap();
    assert!(matches!(a.principal, PrincipalSource::Header));
    assert!(!a.require && !a.verifies_tokens());
}

#[test]
fn jwt_audience_defaults_to_the_resource() {
    let a = auth(JWT).unwrap();
    let PrincipalSource::Jwt(j) = a.principal else {
        panic!("jwt")
    };
    assert_eq!(j.audiences, ["https://mcp.example.com/mcp"]);
    assert_eq!(j.algorithms, [Algorithm::RS256]);
    assert_eq!(j.principal_claim, "sub");
}

#[test]
fn bad_combinations_name_the_key() {
    let key = |r: Result<Auth, ConfigError>| match r {
        Err(ConfigError::Invalid { key, .. }) => key,
        other => panic!("{other:?}"),
    };
    assert_eq!(key(auth("require = true")), "auth.require");
    assert_eq!(key(auth("principal = \"jwt\"")), "auth.jwt.issuer");
    let no_resource = JWT.replace("resource = ", "# resource = ");
    assert_eq!(key(auth(&no_resource)), "auth.resource");
    assert_eq!(key(auth("principal = \"magic\"")), "auth.principal");
    assert_eq!(
        key(auth(&format!("{JWT}\nalgorithms = [\"HS256\"]"))),
        "auth.jwt.algorithms"
    );
    assert_eq!(key(auth("[scopes]\nadmin = [\"a\"]")), "auth.scopes");
    assert_eq!(
        key(auth("forward_authorization = true")),
        "auth.forward_authorization"
    );
    assert_eq!(
        key(auth("subject_header = \"x-user\"")),
        "auth.subject_header"
    );
    assert_eq!(
        key(auth(&format!("subject_header = \"authorization\"\n{JWT}"))),
        "auth.subject_header"
    );
    let both = JWT.replace("jwks_uri", "jwks_file = \"k.json\"\njwks_uri");
    assert_eq!(key(auth(&both)), "auth.jwt");
}
