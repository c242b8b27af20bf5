//! `mrtr-proxy healthcheck`: one GET against the running proxy's probe endpoint, for container
//! HEALTHCHECKs in images without curl. Answers whether it got a 200 within a short timeout.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use http::{Request, StatusCode, Uri};

use crate::body;
use crate::config::Config;
use crate::http_client::{ClientError, OriginClient};

/// How long the probe waits for an answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The `/healthz` URL of the proxy `config` describes: the admin listener when there is one,
/// else the main one; an unspecified address (`0.0.0.0`, `[::]`) is probed on loopback.
pub fn default_url(config: &Config) -> String {
    let addr = config.admin.listen.unwrap_or(config.server.listen);
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}/healthz", SocketAddr::new(ip, addr.port()))
}

/// GETs `url`.
///
/// # Errors
/// A message saying why the probe failed (bad URL, no answer in time, a status other than 200).
pub async fn probe(url: &str) -> Result<(), String> {
    let uri: Uri = url.parse().map_err(|e| format!("bad url {url}: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(format!("bad url {url}: want an absolute http:// URL"));
    }
    let client = OriginClient::new(&uri, PROBE_TIMEOUT, 0);
    let req = Request::get(uri)
        .body(body::empty())
        .map_err(|e| e.to_string())?;
    let resp = client.send(req).await.map_err(|e| match e {
        ClientError::Timeout => format!("{url}: no answer within {PROBE_TIMEOUT:?}"),
        e => format!("{url}: {e}"),
    })?;
    match resp.status() {
        StatusCode::OK => Ok(()),
        other => Err(format!("{url}: http {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_the_admin_listener_first_and_loopback_for_unspecified_addresses() {
        let mut c = Config::from_toml_str("[server]\nlisten = \"0.0.0.0:8080\"\n").unwrap();
        assert_eq!(default_url(&c), "http://127.0.0.1:8080/healthz");
        c.admin.listen = Some("[::]:9090".parse().unwrap());
        assert_eq!(default_url(&c), "http://[::1]:9090/healthz");
        c.admin.listen = Some("10.1.2.3:9090".parse().unwrap());
        assert_eq!(default_url(&c), "http://10.1.2.3:9090/healthz");
    }

    #[tokio::test]
    async fn only_an_http_url_is_probed() {
        let err = probe("https://127.0.0.1:9/healthz").await.unwrap_err();
        assert!(err.contains("http://"), "{err}");
    }
}
