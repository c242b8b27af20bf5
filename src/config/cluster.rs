//! `[cluster]`: the other replicas a retry may be forwarded to (static URLs or a DNS name), and
//! how long to trust and wait for them.

use std::time::Duration;

use http::Uri;
use serde::Deserialize;

use super::error::{invalid, ConfigError};
use super::units::nonzero_duration;
use super::upstream::parse_upstream;

/// `[cluster]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawCluster {
    /// `peers`
    pub peers: Vec<String>,
    /// `peers_dns`
    pub peers_dns: Option<String>,
    /// `refresh_interval`
    pub refresh_interval: Option<String>,
    /// `forward_timeout`
    pub forward_timeout: Option<String>,
    /// `advertise`
    pub advertise: Option<String>,
}

/// `[cluster]`, validated: where the peers are and how long to wait for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// Static peers: the MCP endpoint URL of each (`http://10.0.0.5:8080/mcp`).
    pub peers: Vec<Uri>,
    /// A DNS name and port whose addresses are the peers (a headless Service), resolved again
    /// at most once per `refresh_interval`; each address is reached at `mcp_path`.
    pub peers_dns: Option<(String, u16)>,
    /// How long a learnt peer identity (instance id → URL) is trusted before it is asked again.
    pub refresh_interval: Duration,
    /// How long a forward may take to connect and get response headers from the owner.
    pub forward_timeout: Duration,
    /// This instance's MCP endpoint as the other replicas reach it, announced in a shared
    /// task store (`None`: the listen address, when it names one host).
    pub advertise: Option<Uri>,
}

impl Cluster {
    pub(super) fn from_raw(c: RawCluster) -> Result<Self, ConfigError> {
        let peers = c
            .peers
            .iter()
            .map(|p| parse_upstream(p).map_err(|_| invalid("cluster.peers", "not an http URL")))
            .collect::<Result<Vec<_>, _>>()?;
        let peers_dns = match c.peers_dns {
            None => None,
            Some(s) => {
                let (host, port) = s
                    .rsplit_once(':')
                    .ok_or_else(|| invalid("cluster.peers_dns", "want \"name:port\""))?;
                let port = port
                    .parse::<u16>()
                    .map_err(|_| invalid("cluster.peers_dns", "the port is not a number"))?;
                if host.is_empty() {
                    return Err(invalid("cluster.peers_dns", "the name is empty"));
                }
                Some((host.to_owned(), port))
            }
        };
        let advertise = c
            .advertise
            .as_deref()
            .map(|a| parse_upstream(a).map_err(|_| invalid("cluster.advertise", "not an http URL")))
            .transpose()?;
        Ok(Self {
            peers,
            peers_dns,
            advertise,
            refresh_interval: nonzero_duration(
                "cluster.refresh_interval",
                c.refresh_interval.as_deref(),
                "10s",
            )?,
            forward_timeout: nonzero_duration(
                "cluster.forward_timeout",
                c.forward_timeout.as_deref(),
                "5s",
            )?,
        })
    }

    /// Whether any peer is configured (else a retry for another instance is never forwarded).
    pub fn is_enabled(&self) -> bool {
        !self.peers.is_empty() || self.peers_dns.is_some()
    }
}
