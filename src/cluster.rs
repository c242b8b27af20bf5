//! Scale-out without sticky sessions or a shared store: a retry whose verified requestState
//! names another instance is forwarded to that instance, which resumes its parked call as if the
//! client had come directly; the answer streams back through this one (where this sits in the
//! pipeline: docs/ARCHITECTURE.md; `front/retry` decides to forward).
//!
//! Addresses come only from the configured peer set (`cluster.peers`, `cluster.peers_dns`) or,
//! with a shared task store, from what each replica announced there (sealed under the shared
//! key: `tasks/addresses`), never from a token: a token names an instance id, and which peer has
//! that id is learnt by asking it (`GET` on the MCP path with a peer signature). Peers
//! authenticate each other with the requestState key set they already share: every forwarded
//! request and every probe carries a short-lived JWT (`Mcp-Proxy-Peer`) signed with the active
//! key, naming the target instance and binding the body's digest. A forwarded request is never
//! forwarded again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Request, Response, Uri};
use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::body::{self, Body};
use crate::config;
use crate::http_client::{ClientError, OriginClient};
use crate::ops::metrics::{Forward, ForwardKind, Metrics};
use crate::protocol::HOP_BY_HOP;
use crate::state::{unix, TokenCodec};

/// Header carrying a peer's signature on a forwarded request or a probe.
pub(crate) const PEER_HEADER: HeaderName = HeaderName::from_static("mcp-proxy-peer");
/// How long a peer signature is valid: a forward is sent at once.
const PEER_TOKEN_LIFETIME: Duration = Duration::from_secs(30);
/// The audience of a probe ("which instance are you?"), which any peer answers.
const ANY_INSTANCE: &str = "*";
/// Idle connections kept to each peer, for the forwards that follow.
const MAX_IDLE_PER_PEER: usize = 4;
/// Largest probe answer read.
const MAX_PROBE_BYTES: usize = 4096;
/// What a peer signs.
#[derive(Debug, Serialize, Deserialize)]
struct PeerClaims {
    /// The sending instance.
    iss: String,
    /// The instance it is meant for (`*` for a probe).
    aud: String,
    /// Expiry (unix seconds).
    exp: u64,
    /// Digest of the request body.
    bh: String,
}

/// The client's request as it came, for a forward to the instance that owns its call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Inbound<'a> {
    /// Its headers (hop-by-hop ones and `Host` are not sent on).
    pub(crate) headers: &'a HeaderMap,
    /// Its body, sent on byte for byte.
    pub(crate) bytes: &'a Bytes,
    /// Sent by a peer (its signature verified): never forwarded again.
    pub(crate) forwarded: bool,
}

/// The peer set, what is known of it, the client that forwards to it, and the key set that
/// signs and checks what peers send each other.
#[derive(Debug)]
pub(crate) struct Peers {
    config: config::Cluster,
    mcp_path: String,
    tokens: Arc<TokenCodec>,
    metrics: Arc<Metrics>,
    known: Mutex<Known>,
}

#[derive(Debug, Default)]
struct Known {
    /// Instance id → the peer URL that answered with it.
    by_id: HashMap<String, Uri>,
    /// When the set was last asked.
    asked: Option<Instant>,
    /// A client per peer URL of the last asking (their idle connections kept for forwards).
    clients: HashMap<Uri, OriginClient>,
}

impl Peers {
    /// The peer set of `config`, reached at `mcp_path` when found by DNS; `tokens` signs and
    /// checks peer requests, `metrics` counts forwards.
    pub(crate) fn new(
        config: config::Cluster,
        mcp_path: &str,
        tokens: Arc<TokenCodec>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            config,
            mcp_path: mcp_path.to_owned(),
            tokens,
            metrics,
            known: Mutex::new(Known::default()),
        }
    }

    /// Sends a retry or a `tasks/*` request (`kind`) to `owner`, the instance whose token or
    /// task it names: at most one hop, and only to a peer of the configured set or, when none
    /// of them is `owner`, to the URL `owner` `announced` in a shared task store (sealed under
    /// the shared key; looked up only then), once it answers there as `owner`. The outcome is
    /// counted and logged here.
    ///
    /// # Errors
    /// Why the owner cannot be reached ([`lost_because`] says it in words), for the caller to
    /// answer as a lost call or a lost task.
    pub(crate) async fn forward(
        &self,
        (owner, announced): (&str, impl std::future::Future<Output = Option<Uri>>),
        inbound: Inbound<'_>,
        kind: ForwardKind,
    ) -> Result<Response<Body>, Forward> {
        let outcome = if inbound.forwarded {
            Err(Forward::Loop)
        } else {
            let found = match self.find(owner).await {
                None => self.confirm(owner, announced).await,
                url => url,
            };
            match found {
                None => Err(Forward::UnknownOwner),
                Some(url) => self.send((owner, url), inbound).await,
            }
        };
        let result = outcome.as_ref().err().copied().unwrap_or(Forward::Ok);
        self.metrics.cluster.forwarded(kind, result);
        if outcome.is_ok() {
            tracing::debug!(owner, kind = kind.as_str(), "forwarded to the owner");
        } else {
            tracing::info!(
                owner,
                kind = kind.as_str(),
                result = result.as_str(),
                "cannot forward to the owner"
            );
        }
        outcome
    }

    // The URL `owner` announced in a shared task store, once it answers there as `owner`
    // (then remembered as a peer's would be).
    async fn confirm(
        &self,
        owner: &str,
        announced: impl std::future::Future<Output = Option<Uri>>,
    ) -> Option<Uri> {
        let url = announced.await?;
        if self.ask(&url).await.as_deref() != Some(owner) {
            return None;
        }
        let mut known = self.known.lock().ok()?;
        known.by_id.insert(owner.to_owned(), url.clone());
        Some(url)
    }

    // The URL of the peer whose instance id is `owner`; the set is asked again when the id is
    // not known and the last asking is older than `cluster.refresh_interval`.
    async fn find(&self, owner: &str) -> Option<Uri> {
        if !self.config.is_enabled() {
            return None;
        }
        let stale = {
            let known = self.known.lock().ok()?;
            if let Some(url) = known.by_id.get(owner) {
                return Some(url.clone());
            }
            known
                .asked
                .is_none_or(|t| t.elapsed() >= self.config.refresh_interval)
        };
        if !stale {
            return None;
        }
        self.learn(self.ask_all().await);
        self.known.lock().ok()?.by_id.get(owner).cloned()
    }

    /// Tells the peers that this instance started, by asking each which instance it is (signed
    /// as this instance), and keeps their answers. A peer that did not know this instance's id
    /// asks the set again at its next unknown owner (see [`Peers::verify`]): so the calls of a
    /// replica restarted under a new id are found on the others at once, not only after their
    /// `cluster.refresh_interval` has passed since they last asked (maybe while it was down).
    pub(crate) async fn announce(&self) {
        if self.config.is_enabled() {
            self.learn(self.ask_all().await);
        }
    }

    // Keeps what an asking of the set found (instance id → peer URL).
    fn learn(&self, found: HashMap<String, Uri>) {
        if let Ok(mut known) = self.known.lock() {
            known
                .clients
                .retain(|url, _| found.values().any(|u| u == url));
            known.by_id = found;
            known.asked = Some(Instant::now());
        }
    }

    // A peer signed a request as `iss`. An id the last asking did not find is an instance that
    // started since (a restart under a new id): the next unknown owner asks the set again at
    // once. Only a holder of the key set can sign, so clients cannot make the set be asked.
    fn heard_from(&self, iss: &str) {
        if iss == self.tokens.issuer() {
            return;
        }
        if let Ok(mut known) = self.known.lock() {
            if !known.by_id.contains_key(iss) {
                known.asked = None;
            }
        }
    }

    // Asks every peer of the set, at once, which instance it is.
    async fn ask_all(&self) -> HashMap<String, Uri> {
        let urls = self.urls().await;
        let answers = futures_util::future::join_all(urls.into_iter().map(|url| async move {
            let id = self.ask(&url).await?;
            Some((id, url))
        }))
        .await;
        answers.into_iter().flatten().collect()
    }

    // The peer URLs: the static ones and, when configured, every address of the DNS name.
    async fn urls(&self) -> Vec<Uri> {
        let mut urls = self.config.peers.clone();
        if let Some((name, port)) = &self.config.peers_dns {
            match tokio::net::lookup_host((name.as_str(), *port)).await {
                Ok(addrs) => urls
                    .extend(addrs.filter_map(|a| {
                        format!("http://{a}{}", self.mcp_path).parse::<Uri>().ok()
                    })),
                Err(e) => {
                    tracing::warn!(name = %name, error = %e, "cannot resolve cluster.peers_dns")
                }
            }
        }
        urls.sort_by_key(ToString::to_string);
        urls.dedup();
        urls
    }

    // One probe: the instance id `url` answers with, if it answers in time as a peer.
    async fn ask(&self, url: &Uri) -> Option<String> {
        let mut req = Request::get(url.clone()).body(body::empty()).ok()?;
        req.headers_mut()
            .insert(PEER_HEADER, self.sign(ANY_INSTANCE, b"")?);
        let timeout = self.config.forward_timeout;
        let resp = self.client(url).send(req).await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let limited = http_body_util::Limited::new(resp.into_body(), MAX_PROBE_BYTES);
        let bytes = tokio::time::timeout(timeout, limited.collect())
            .await
            .ok()?
            .ok()?
            .to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
        let id = v.get("instance")?.as_str()?;
        (id != self.tokens.issuer()).then(|| id.to_owned())
    }

    // Sends the client's request to the owner `owner` at `url`, signed for it; the owner's
    // answer, streamed. When the owner does not answer in time its id is forgotten, so the next
    // retry asks the set again.
    async fn send(
        &self,
        (owner, url): (&str, Uri),
        inbound: Inbound<'_>,
    ) -> Result<Response<Body>, Forward> {
        let mut req = Request::post(url.clone())
            .body(body::full(inbound.bytes.clone()))
            .map_err(|_| Forward::Unreachable)?;
        for (name, value) in inbound.headers {
            let not_sent = HOP_BY_HOP.contains(name)
                || [header::HOST, header::CONTENT_LENGTH, PEER_HEADER].contains(name);
            if !not_sent {
                req.headers_mut().append(name, value.clone());
            }
        }
        let signature = self
            .sign(owner, inbound.bytes)
            .ok_or(Forward::Unreachable)?;
        req.headers_mut().insert(PEER_HEADER, signature);
        match self.client(&url).send(req).await {
            Ok(resp) => Ok(resp.map(|b| b.map_err(Into::into).boxed())),
            Err(e) => {
                if let Ok(mut known) = self.known.lock() {
                    known.by_id.remove(owner);
                }
                Err(match e {
                    ClientError::Timeout => Forward::Timeout,
                    _ => Forward::Unreachable,
                })
            }
        }
    }

    // The client for the peer at `url` (made on first use; dropped when the peer leaves the set).
    fn client(&self, url: &Uri) -> OriginClient {
        let make = || OriginClient::new(url, self.config.forward_timeout, MAX_IDLE_PER_PEER);
        match self.known.lock() {
            Ok(mut known) => known
                .clients
                .entry(url.clone())
                .or_insert_with(make)
                .clone(),
            Err(_) => make(),
        }
    }

    /// A peer signature from this instance for `aud` over `body`, valid for a few seconds.
    pub(crate) fn sign(&self, aud: &str, body: &[u8]) -> Option<HeaderValue> {
        let codec = &self.tokens;
        let claims = PeerClaims {
            iss: codec.issuer().to_owned(),
            aud: aud.to_owned(),
            exp: unix(codec.now() + PEER_TOKEN_LIFETIME),
            bh: body_digest(body),
        };
        let token = codec.sign_jwt(&claims).ok()?;
        HeaderValue::from_str(&token).ok()
    }

    /// Whether `value` is a valid peer signature over `body`: a key of the set, not expired,
    /// meant for this instance (or any, for a probe when `probe`), and the body's digest.
    pub(crate) fn verify(&self, value: &HeaderValue, body: &[u8], probe: bool) -> bool {
        let codec = &self.tokens;
        let now = codec.now();
        let Ok(token) = value.to_str() else {
            return false;
        };
        let Ok((c, _)) = codec.decode_jwt::<PeerClaims>(token, now) else {
            return false;
        };
        let aud_ok = c.aud == codec.issuer() || (probe && c.aud == ANY_INSTANCE);
        let valid = aud_ok
            && unix(now) < c.exp
            && c.exp <= unix(now + PEER_TOKEN_LIFETIME) + 60
            && c.bh == body_digest(body);
        if valid {
            self.heard_from(&c.iss);
        }
        valid
    }

    /// The answer to a probe: this instance's id.
    pub(crate) fn identity(&self) -> Bytes {
        let body = serde_json::json!({ "instance": self.tokens.issuer() });
        Bytes::from(crate::jsonrpc::text(&body))
    }
}

fn body_digest(body: &[u8]) -> String {
    let d = Sha256::digest(body);
    hex::encode(&d[..16])
}

/// Why an owner could not be reached, in words for the client's error.
pub(crate) fn lost_because(reason: Forward) -> &'static str {
    match reason {
        Forward::Loop => "it reached a second instance that does not hold it",
        Forward::Unreachable => "that instance refuses connections",
        Forward::Timeout => "that instance does not answer in time",
        Forward::UnknownOwner | Forward::Ok => "that instance is not among the peers",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::testing::{codec_of, KEY};

    fn peers_with(cfg: config::Cluster, id: &str, secret: &str) -> Peers {
        Peers::new(cfg, "/mcp", Arc::new(codec_of(id, secret)), Arc::default())
    }

    fn peer(id: &str, secret: &str) -> Peers {
        let none = config::Cluster {
            peers: Vec::new(),
            peers_dns: None,
            refresh_interval: Duration::from_secs(10),
            forward_timeout: Duration::from_millis(200),
            advertise: None,
        };
        peers_with(none, id, secret)
    }

    #[test]
    fn a_peer_signature_binds_target_body_and_key() {
        let a = peer("a", KEY);
        let b = peer("b", KEY);
        let sig = a.sign("b", b"{\"x\":1}").unwrap();
        assert!(b.verify(&sig, b"{\"x\":1}", false));
        assert!(!b.verify(&sig, b"{\"x\":2}", false), "another body");
        assert!(
            !peer("c", KEY).verify(&sig, b"{\"x\":1}", false),
            "another target"
        );
        let stranger = peer("b", "another-key-another-key-another-key");
        assert!(!stranger.verify(&sig, b"{\"x\":1}", false), "another key");
        assert!(!b.verify(&HeaderValue::from_static("x.y.z"), b"", false));
    }

    #[test]
    fn a_probe_signature_is_for_any_instance_but_only_probes() {
        let a = peer("a", KEY);
        let b = peer("b", KEY);
        let probe = a.sign(ANY_INSTANCE, b"").unwrap();
        assert!(b.verify(&probe, b"", true));
        assert!(
            !b.verify(&probe, b"", false),
            "a probe cannot carry a forward"
        );
    }

    #[tokio::test]
    async fn peers_come_from_the_list_and_dns_deduplicated() {
        let cfg = config::Cluster {
            peers: vec![
                "http://127.0.0.1:9/mcp".parse().unwrap(),
                "http://127.0.0.1:9/mcp".parse().unwrap(),
            ],
            peers_dns: Some(("localhost".into(), 7)),
            refresh_interval: Duration::from_secs(10),
            forward_timeout: Duration::from_millis(200),
            advertise: None,
        };
        let peers = peers_with(cfg, "a", KEY);
        let urls: Vec<String> = peers.urls().await.iter().map(ToString::to_string).collect();
        assert!(
            urls.contains(&"http://127.0.0.1:9/mcp".to_owned()),
            "{urls:?}"
        );
        assert!(
            urls.iter().any(|u| u.ends_with(":7/mcp")),
            "the DNS name's addresses at mcp_path: {urls:?}"
        );
        assert_eq!(
            urls.iter()
                .filter(|u| u.as_str() == "http://127.0.0.1:9/mcp")
                .count(),
            1
        );
    }

    #[tokio::test]
    async fn an_id_no_peer_has_is_not_forwarded_and_not_asked_again_at_once() {
        let cfg = config::Cluster {
            // Nothing listens on the discard port: the probe fails fast.
            peers: vec!["http://127.0.0.1:9/mcp".parse().unwrap()],
            peers_dns: None,
            refresh_interval: Duration::from_secs(3600),
            forward_timeout: Duration::from_millis(500),
            advertise: None,
        };
        let peers = peers_with(cfg, "a", KEY);
        assert_eq!(peers.find("b").await, None);
        let asked = peers.known.lock().unwrap().asked;
        assert_eq!(peers.find("c").await, None);
        assert_eq!(
            peers.known.lock().unwrap().asked,
            asked,
            "within the interval"
        );
    }
}
