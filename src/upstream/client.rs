//! The HTTP client for the one configured upstream, and how talking to it fails.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::body::Body;
use crate::sse::SseError;

/// A failure talking to the upstream.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    /// Could not connect or the connection broke.
    #[error("upstream unreachable: {0}")]
    Connect(String),
    /// No response headers within the configured timeout.
    #[error("upstream timed out")]
    Timeout,
    /// An HTTP status we cannot use.
    #[error("upstream answered http {0}")]
    Status(StatusCode),
    /// The upstream refused the request as malformed or too large (400, 413, 414, 431): the
    /// client's doing (an oversized `Authorization`, say), so the client gets the same status.
    #[error("the upstream refused the request (http {0})")]
    Refused(StatusCode),
    /// The upstream refused the request's credentials (401) or permissions (403): the client
    /// gets the same status and the upstream's `WWW-Authenticate` challenge, to authenticate.
    #[error("the upstream refused the request's credentials (http {status})")]
    Unauthorized {
        /// 401 or 403.
        status: StatusCode,
        /// The upstream's `WWW-Authenticate` header.
        challenge: Option<http::HeaderValue>,
    },
    /// The upstream broke the protocol (bad JSON, missing session id, …).
    #[error("upstream protocol error: {0}")]
    Protocol(String),
    /// The pool is at `pool.max_sessions` and no session came free within
    /// `pool.acquire_timeout` (a proxy limit: 503 + Retry-After).
    #[error("{0}")]
    Busy(&'static str),
    /// A stdio server failed to start and waits out its backoff before the next try (503 +
    /// `Retry-After`).
    #[error(
        "the upstream server did not start ({last}); it is started again in {retry_after_s} s"
    )]
    Starting {
        /// Why the last start failed.
        last: String,
        /// Seconds until the next start.
        retry_after_s: u64,
    },
    /// The upstream no longer knows our session (404).
    #[error("upstream session expired")]
    SessionGone,
    /// The response stream ended before the call's result.
    #[error("upstream closed the stream before the result")]
    Closed,
    /// An SSE event broke the decoder's bounds.
    #[error(transparent)]
    Sse(#[from] SseError),
}

impl UpstreamError {
    /// The status the client sees.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Self::Timeout => StatusCode::GATEWAY_TIMEOUT,
            Self::Busy(_) | Self::Starting { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Unauthorized { status, .. } | Self::Refused(status) => *status,
            _ => StatusCode::BAD_GATEWAY,
        }
    }

    /// The error for an upstream response with an unusable status.
    pub(crate) fn from_status<B>(resp: &Response<B>) -> Self {
        let status = resp.status();
        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            Self::Unauthorized {
                status,
                challenge: resp.headers().get(http::header::WWW_AUTHENTICATE).cloned(),
            }
        } else if matches!(
            status,
            StatusCode::BAD_REQUEST
                | StatusCode::PAYLOAD_TOO_LARGE
                | StatusCode::URI_TOO_LONG
                | StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        ) {
            Self::Refused(status)
        } else {
            Self::Status(status)
        }
    }
}

/// HTTP client for the one configured upstream.
#[derive(Debug, Clone)]
pub(crate) struct UpstreamClient {
    http: Client<HttpConnector, Body>,
    uri: Uri,
    timeout: Duration,
    max_event_bytes: usize,
    /// False since a connection to the upstream failed, until one succeeds again.
    reachable: Arc<AtomicBool>,
}

impl UpstreamClient {
    /// A client for `uri`, keeping at most `max_idle` idle connections to it.
    pub(crate) fn new(
        uri: Uri,
        timeout: Duration,
        max_event_bytes: usize,
        max_idle: usize,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        connector.set_nodelay(true);
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            // Unbounded, every session ever closed left its connection here for 30 s: thousands
            // of expired calls kept their buffers (and file descriptors) after they were gone.
            .pool_max_idle_per_host(max_idle)
            .build(connector);
        Self {
            http,
            uri,
            timeout,
            max_event_bytes,
            reachable: Arc::new(AtomicBool::new(true)),
        }
    }

    /// The upstream MCP endpoint.
    pub(crate) fn uri(&self) -> &Uri {
        &self.uri
    }

    /// Largest accepted SSE event / JSON body.
    pub(crate) fn max_event_bytes(&self) -> usize {
        self.max_event_bytes
    }

    /// Sends a request; waits at most the configured timeout for the response headers.
    ///
    /// # Errors
    /// [`UpstreamError::Connect`] or [`UpstreamError::Timeout`].
    pub(crate) async fn send(
        &self,
        req: Request<Body>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        match tokio::time::timeout(self.timeout, self.send_untimed(req)).await {
            Ok(r) => r,
            Err(_) => Err(UpstreamError::Timeout),
        }
    }

    /// Sends a request with only the connect timeout; the caller bounds the wait for headers.
    ///
    /// # Errors
    /// [`UpstreamError::Connect`].
    pub(crate) async fn send_untimed(
        &self,
        req: Request<Body>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        match self.http.request(req).await {
            Ok(resp) => {
                self.reachable.store(true, Ordering::Relaxed);
                Ok(resp)
            }
            Err(e) => {
                if e.is_connect() {
                    self.reachable.store(false, Ordering::Relaxed);
                }
                Err(UpstreamError::Connect(e.to_string()))
            }
        }
    }

    /// False since the last attempt to reach the upstream failed to connect.
    pub(crate) fn is_reachable(&self) -> bool {
        self.reachable.load(Ordering::Relaxed)
    }

    /// Opens (and closes) a TCP connection to the upstream: the cheap liveness check readiness
    /// follows between requests. Records and returns whether it connected.
    pub(crate) async fn check_connect(&self) -> bool {
        let host = self.uri.host().unwrap_or("127.0.0.1");
        let port = self.uri.port_u16().unwrap_or(80);
        let connect = tokio::net::TcpStream::connect((host, port));
        let ok = matches!(tokio::time::timeout(self.timeout, connect).await, Ok(Ok(_)));
        self.reachable.store(ok, Ordering::Relaxed);
        ok
    }

    /// The configured connect + response-header timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }
}
