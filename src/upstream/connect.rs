//! Opening a session on whichever transport the upstream speaks: Streamable HTTP, HTTP+SSE
//! (configured, or detected the way the spec's backwards-compatibility procedure says: a POSTed
//! `initialize` refused with a 4xx, then a `GET` that answers with an `endpoint` event), or a stdio
//! child, started again with backoff when starting fails.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::client::{UpstreamClient, UpstreamError};
use super::credentials::LiveCredentials;
use super::link::Link;
use super::session::{Session, SessionParams};
use super::{sse_session, stdio};
use crate::config::UpstreamTransport;

/// Longest wait before starting a failing stdio server again.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// First wait after a failed start; doubled on each further one.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);

const UNKNOWN: u8 = 0;
const STREAMABLE: u8 = 1;
const SSE: u8 = 2;

/// Opens sessions on the configured transport.
#[derive(Debug)]
pub(crate) struct Connector {
    transport: UpstreamTransport,
    /// With `auto`: what the upstream turned out to speak.
    detected: AtomicU8,
    backoff: Mutex<Backoff>,
}

#[derive(Debug, Default)]
struct Backoff {
    failures: u32,
    until: Option<Instant>,
    /// Why the last start failed.
    last: String,
}

impl Connector {
    /// A connector for `transport`.
    pub(crate) fn new(transport: UpstreamTransport) -> Self {
        let detected = match transport {
            UpstreamTransport::Sse => SSE,
            UpstreamTransport::StreamableHttp => STREAMABLE,
            _ => UNKNOWN,
        };
        Self {
            transport,
            detected: AtomicU8::new(detected),
            backoff: Mutex::new(Backoff::default()),
        }
    }

    /// Whether legacy clients can be relayed: only to a Streamable HTTP upstream (or one not
    /// yet known to be anything else).
    pub(crate) fn relays_legacy_clients(&self) -> bool {
        !matches!(self.transport, UpstreamTransport::Stdio(_))
            && self.detected.load(Ordering::Relaxed) != SSE
    }

    /// With `auto`, whether the upstream's transport is still unknown (no session opened yet).
    pub(crate) fn undetected(&self) -> bool {
        matches!(self.transport, UpstreamTransport::Auto)
            && self.detected.load(Ordering::Relaxed) == UNKNOWN
    }

    /// The transport's name (for logs): what was configured, or what `auto` found.
    pub(crate) fn name(&self) -> &'static str {
        match (&self.transport, self.detected.load(Ordering::Relaxed)) {
            (UpstreamTransport::Auto, STREAMABLE) => "streamable-http (detected)",
            (UpstreamTransport::Auto, SSE) => "sse (detected)",
            (t, _) => t.name(),
        }
    }

    /// Whether readiness can ask the network (a TCP connect) rather than the last start.
    pub(crate) fn is_network(&self) -> bool {
        !matches!(self.transport, UpstreamTransport::Stdio(_))
    }

    /// False while a stdio server that failed to start waits out its backoff.
    pub(crate) fn is_starting_well(&self) -> bool {
        self.backoff.lock().map_or(true, |b| b.failures == 0)
    }

    /// Opens a session and runs its handshake.
    ///
    /// # Errors
    /// The transport's and the handshake's errors; [`UpstreamError::Starting`] while a stdio
    /// server that failed to start waits out a backoff that ends after `deadline`.
    pub(crate) async fn open(
        &self,
        client: &UpstreamClient,
        params: SessionParams,
        permit: OwnedSemaphorePermit,
        deadline: Instant,
    ) -> Result<Arc<Session>, UpstreamError> {
        if let UpstreamTransport::Stdio(cmd) = &self.transport {
            self.wait_backoff(deadline).await?;
            let started = async {
                let link = stdio::spawn(cmd, client.max_event_bytes(), client.timeout())?;
                Session::over_link(client.clone(), link, params, permit).await
            };
            let outcome = started.await;
            self.record(outcome.as_ref().err());
            return outcome;
        }
        if self.detected.load(Ordering::Relaxed) == SSE {
            let link = sse_session::open(client, Arc::clone(&params.credentials)).await?;
            return Session::over_link(client.clone(), link, params, permit).await;
        }
        match Session::handshake(client, &params).await {
            Ok(hs) => {
                self.detected.store(STREAMABLE, Ordering::Relaxed);
                Session::start(client.clone(), hs, params, permit).await
            }
            Err(e) if self.may_fall_back(&e) => {
                let link = match sse_session::open(client, Arc::clone(&params.credentials)).await {
                    Ok(link) => link,
                    Err(get) => {
                        return Err(UpstreamError::Protocol(format!(
                            "the upstream URL is neither Streamable HTTP (a POSTed initialize got: \
                             {e}) nor HTTP+SSE (a GET got: {get})"
                        )))
                    }
                };
                let session = Session::over_link(client.clone(), link, params, permit).await?;
                if self.detected.swap(SSE, Ordering::Relaxed) != SSE {
                    tracing::info!(url = %client.uri(), "the upstream speaks HTTP+SSE (detected)");
                }
                Ok(session)
            }
            Err(e) => Err(e),
        }
    }

    /// Opens the transport of a stdio or HTTP+SSE upstream without a handshake: a legacy
    /// client's own session (`upstream::own`) runs the client's.
    ///
    /// # Errors
    /// The transport's; [`UpstreamError::Starting`] as [`Connector::open`].
    pub(crate) async fn open_link(
        &self,
        client: &UpstreamClient,
        credentials: Arc<LiveCredentials>,
        deadline: Instant,
    ) -> Result<Arc<Link>, UpstreamError> {
        if let UpstreamTransport::Stdio(cmd) = &self.transport {
            self.wait_backoff(deadline).await?;
            let link = stdio::spawn(cmd, client.max_event_bytes(), client.timeout());
            self.record(link.as_ref().err());
            return link;
        }
        sse_session::open(client, credentials).await
    }

    // With `auto`, unless Streamable HTTP worked before: a 4xx other than a refusal of credentials
    // means "not Streamable HTTP here" (405 from Python's SSE server, 404 from an Express one).
    fn may_fall_back(&self, e: &UpstreamError) -> bool {
        let status = match e {
            UpstreamError::Status(s) | UpstreamError::Refused(s) => *s,
            _ => return false,
        };
        // Not only while unknown: a concurrent first open may have found HTTP+SSE meanwhile.
        matches!(self.transport, UpstreamTransport::Auto)
            && self.detected.load(Ordering::Relaxed) != STREAMABLE
            && status.is_client_error()
    }

    // Waits out a stdio server's backoff when it ends before `deadline`; else says when to retry.
    async fn wait_backoff(&self, deadline: Instant) -> Result<(), UpstreamError> {
        let (until, last) = match self.backoff.lock() {
            Ok(b) => (b.until, b.last.clone()),
            Err(_) => (None, String::new()),
        };
        match until {
            Some(t) if t > deadline => Err(UpstreamError::Starting {
                last,
                retry_after_s: (t - Instant::now()).as_secs_f64().ceil().max(1.0) as u64,
            }),
            Some(t) => {
                tokio::time::sleep_until(t).await;
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn record(&self, failure: Option<&UpstreamError>) {
        let Ok(mut b) = self.backoff.lock() else {
            return;
        };
        match failure {
            // Credentials refused: the server is up.
            None | Some(UpstreamError::Unauthorized { .. }) => *b = Backoff::default(),
            Some(e) => {
                b.failures = b.failures.saturating_add(1);
                let wait = FIRST_BACKOFF
                    .saturating_mul(1 << b.failures.saturating_sub(1).min(8))
                    .min(MAX_BACKOFF);
                b.until = Some(Instant::now() + wait);
                b.last = e.to_string();
                tracing::warn!(error = %e, failures = b.failures, retry_in_ms = wait.as_millis() as u64,
                    "the upstream server did not start");
            }
        }
    }
}
