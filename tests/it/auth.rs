//! OAuth at the edge (`[auth]`): verified principals (JWT, introspection), resource-server mode,
//! pass-through metadata and challenges. [`AuthServer`] is an in-process authorization server
//! on 127.0.0.1:0 serving a JWKS and an RFC 7662 introspection endpoint and counting what it is
//! asked; [`Key`] signs EdDSA tokens whose JWK it publishes there.

mod config;
mod introspection;
mod jwt;
mod legacy;
mod pass_through;
mod resource_server;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use mrtr_proxy::body::{full, Body};
use mrtr_proxy::demo::client::{Exchange, ModernClient};
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::support::mock::{Mock, Step};
use crate::support::{all_caps, TestProxy};

/// The proxy's public MCP endpoint (the tokens' audience).
pub const RESOURCE: &str = "https://mcp.example.com/mcp";
/// Where its protected-resource metadata is (RFC 9728).
pub const PRM_URL: &str = "https://mcp.example.com/.well-known/oauth-protected-resource/mcp";
/// The authorization server's issuer.
pub const ISSUER: &str = "https://as.example";
/// `[auth]` lines of resource-server mode.
pub const RS: &str = "require = true\nsubject_header = \"x-mcp-subject\"";

/// An Ed25519 signing key with its `kid`.
pub struct Key {
    kid: String,
    pkcs8: Vec<u8>,
    x: String,
}

impl Key {
    pub fn new(kid: &str) -> Self {
        let rng = ring::rand::SystemRandom::new();
        let doc = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pair = Ed25519KeyPair::from_pkcs8(doc.as_ref()).unwrap();
        Self {
            kid: kid.to_owned(),
            pkcs8: doc.as_ref().to_vec(),
            x: URL_SAFE_NO_PAD.encode(pair.public_key().as_ref()),
        }
    }

    /// Its public JWK.
    pub fn jwk(&self) -> Value {
        json!({"kty":"OKP","crv":"Ed25519","x":self.x,"kid":self.kid,"alg":"EdDSA","use":"sig"})
    }

    /// A JWT of `claims` signed with this key (EdDSA, `kid` in the header).
    pub fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &EncodingKey::from_ed_der(&self.pkcs8)).unwrap()
    }

    /// `Bearer <a fresh valid token of sub>` (each call a different token).
    pub fn bearer(&self, sub: &str) -> String {
        format!("Bearer {}", self.sign(&claims(sub)))
    }
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Valid claims of `sub`: this issuer, for [`RESOURCE`], scope `mcp`, a unique `jti`.
pub fn claims(sub: &str) -> Value {
    static JTI: AtomicU64 = AtomicU64::new(0);
    let jti = JTI.fetch_add(1, Ordering::Relaxed);
    json!({"iss": ISSUER, "aud": RESOURCE, "sub": sub, "iat": now(), "exp": now() + 600,
           "scope": "mcp", "jti": format!("t{jti}")})
}

#[derive(Default)]
struct AsState {
    jwks: Mutex<Vec<Value>>,
    jwks_fetches: AtomicUsize,
    // Introspection answers by token (unknown tokens are inactive).
    answers: Mutex<HashMap<String, Value>>,
    // (token, Authorization) of every introspection request.
    introspected: Mutex<Vec<(String, Option<String>)>>,
}

/// The authorization server: `GET /jwks`, `POST /introspect`; stops on drop.
pub struct AuthServer {
    addr: std::net::SocketAddr,
    state: Arc<AsState>,
    task: tokio::task::JoinHandle<()>,
}

impl AuthServer {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(AsState::default());
        let task = mrtr_proxy::demo::upstream::serve(listener, Arc::clone(&state), serve_as);
        Self { addr, state, task }
    }

    /// Started, publishing `key`.
    pub async fn with(key: &Key) -> Self {
        let s = Self::start().await;
        s.publish(&[key]);
        s
    }

    pub fn jwks_uri(&self) -> String {
        format!("http://{}/jwks", self.addr)
    }

    pub fn introspection_uri(&self) -> String {
        format!("http://{}/introspect", self.addr)
    }

    /// From now on the key set is `keys`.
    pub fn publish(&self, keys: &[&Key]) {
        *self.state.jwks.lock().unwrap() = keys.iter().map(|k| k.jwk()).collect();
    }

    /// How often the key set was fetched.
    pub fn jwks_fetches(&self) -> usize {
        self.state.jwks_fetches.load(Ordering::SeqCst)
    }

    /// From now on introspecting `token` answers `answer`.
    pub fn answer(&self, token: &str, answer: Value) {
        self.state
            .answers
            .lock()
            .unwrap()
            .insert(token.to_owned(), answer);
    }

    /// (token, Authorization) of every introspection request so far.
    pub fn introspected(&self) -> Vec<(String, Option<String>)> {
        self.state.introspected.lock().unwrap().clone()
    }
}

impl Drop for AuthServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_as(st: Arc<AsState>, req: Request<Incoming>) -> Response<Body> {
    let answer = match (req.method().clone(), req.uri().path()) {
        (Method::GET, "/jwks") => {
            st.jwks_fetches.fetch_add(1, Ordering::SeqCst);
            json!({"keys": *st.jwks.lock().unwrap()})
        }
        (Method::POST, "/introspect") => {
            let auth = req
                .headers()
                .get("authorization")
                .map(|v| v.to_str().unwrap().to_owned());
            let form = req.into_body().collect().await.unwrap().to_bytes();
            let form = String::from_utf8(form.to_vec()).unwrap();
            // The tests' tokens are form-safe: no decoding needed.
            let token = form
                .split('&')
                .find_map(|p| p.strip_prefix("token="))
                .unwrap_or_default()
                .to_owned();
            st.introspected.lock().unwrap().push((token.clone(), auth));
            let known = st.answers.lock().unwrap().get(&token).cloned();
            known.unwrap_or_else(|| json!({"active": false}))
        }
        _ => {
            let mut r = Response::new(full("not found"));
            *r.status_mut() = StatusCode::NOT_FOUND;
            return r;
        }
    };
    let mut r = Response::new(full(answer.to_string()));
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    r
}

/// `[auth]` with `principal = "jwt"` verifying EdDSA tokens from `jwks_uri`; `auth_extra` goes in
/// `[auth]`, `jwt_extra` in `[auth.jwt]`.
pub fn jwt_config(jwks_uri: &str, auth_extra: &str, jwt_extra: &str) -> String {
    format!(
        "[auth]\nprincipal = \"jwt\"\nresource = \"{RESOURCE}\"\n\
         authorization_servers = [\"{ISSUER}\"]\nscopes_supported = [\"mcp\"]\n{auth_extra}\n\
         [auth.jwt]\nissuer = \"{ISSUER}\"\njwks_uri = \"{jwks_uri}\"\n\
         algorithms = [\"EdDSA\"]\n{jwt_extra}\n"
    )
}

/// `[auth]` with `principal = "introspection"` at `endpoint`; extras as in [`jwt_config`].
pub fn introspection_config(endpoint: &str, auth_extra: &str, extra: &str) -> String {
    format!(
        "[auth]\nprincipal = \"introspection\"\nresource = \"{RESOURCE}\"\n\
         authorization_servers = [\"{ISSUER}\"]\nscopes_supported = [\"mcp\"]\n{auth_extra}\n\
         [auth.introspection]\nendpoint = \"{endpoint}\"\n{extra}\n"
    )
}

/// A client of `proxy` declaring every capability and sending `Authorization: authorization`.
pub fn client_with(proxy: &TestProxy, authorization: &str) -> ModernClient {
    let mut c = proxy.client(all_caps());
    c.headers
        .push(("authorization".into(), authorization.to_owned()));
    c
}

/// `tools/list` as `authorization`.
pub async fn list_tools(proxy: &TestProxy, authorization: &str) -> Exchange {
    let c = client_with(proxy, authorization);
    c.request("tools/list", json!({})).await.unwrap()
}

/// The `WWW-Authenticate` of an exchange (panics without one).
pub fn challenge(ex: &Exchange) -> String {
    let value = ex.headers.get("www-authenticate");
    let value = value.unwrap_or_else(|| panic!("no challenge: {} {:?}", ex.status, ex.last));
    value.to_str().unwrap().to_owned()
}

/// Scripts `ask`: one elicitation (id 1), then a result.
pub fn script_ask(mock: &Mock) {
    let steps = vec![
        Step::elicit(1),
        Step::Await(1),
        Step::Reply(json!({"content": []})),
    ];
    mock.script("ask", vec![steps]);
}

/// Answers to the round of [`script_ask`].
pub fn answers() -> Value {
    json!({"elicitation-1": {"action": "accept", "content": {}}})
}

/// The proxy in front of `mock` with `toml`, once the proxy's own readiness probe (a
/// credential-less `initialize`, then `notifications/initialized`) has reached the mock: what
/// the mock records after it is the clients' traffic ([`client_posts`]).
pub async fn start(mock: &Mock, toml: &str) -> TestProxy {
    let proxy = TestProxy::start(&mock.url(), toml).await;
    let probed = |m: &Value| m["method"] == "notifications/initialized";
    mock.wait_for("the proxy's readiness probe", probed).await;
    proxy
}

/// Every message POSTed to the mock after the readiness probe (see [`start`]), with its headers.
pub fn client_posts(mock: &Mock) -> Vec<(Value, http::HeaderMap)> {
    let all = mock.posted_with_headers();
    let probe = all
        .iter()
        .position(|(m, _)| m["method"] == "notifications/initialized")
        .expect("the proxy was started with `start`");
    all[probe + 1..].to_vec()
}

/// The `name` header of every client POST (see [`client_posts`]) whose message matches `pred`.
pub fn header_of(mock: &Mock, name: &str, pred: impl Fn(&Value) -> bool) -> Vec<Option<String>> {
    client_posts(mock)
        .into_iter()
        .filter(|(m, _)| pred(m))
        .map(|(_, h)| h.get(name).map(|v| v.to_str().unwrap().to_owned()))
        .collect()
}

/// GETs `path` on the proxy: status, headers, JSON body (`Null` if not JSON).
pub async fn get_json(proxy: &TestProxy, path: &str) -> (StatusCode, http::HeaderMap, Value) {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Body>();
    let req = Request::get(format!("http://{}{path}", proxy.addr))
        .body(mrtr_proxy::body::empty())
        .unwrap();
    let resp = http.request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    let doc = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (parts.status, parts.headers, doc)
}

/// An address nothing listens on (a listener bound, then dropped).
pub async fn closed_port() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}
