//! The client of the one configured upstream (the proxy's one-origin client, `http_client`,
//! with what the upstream needs besides: its URL, the SSE bound, whether it is reachable), and
//! how talking to the upstream fails.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode, Uri};

use crate::body::Body;
use crate::http_client::{ClientError, OriginClient};
use crate::sse::SseError;

/// A response body from the upstream (it returns its connection when it ends).
pub(crate) use crate::http_client::ResponseBody as UpstreamBody;

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

/// `answered` before the upstream first answered.
const NEVER: u64 = u64::MAX;

/// HTTP client for the one configured upstream.
#[derive(Debug, Clone)]
pub(crate) struct UpstreamClient {
    http: OriginClient,
    uri: Uri,
    max_event_bytes: usize,
    /// False since a connection to the upstream failed, until one succeeds again.
    reachable: Arc<AtomicBool>,
    /// When the upstream last answered a request (milliseconds since `born`).
    answered: Arc<AtomicU64>,
    born: Instant,
}

impl UpstreamClient {
    /// A client for `uri`, keeping at most `max_idle` idle connections to it.
    pub(crate) fn new(
        uri: Uri,
        timeout: Duration,
        max_event_bytes: usize,
        max_idle: usize,
    ) -> Self {
        Self {
            http: OriginClient::new(&uri, timeout, max_idle),
            uri,
            max_event_bytes,
            reachable: Arc::new(AtomicBool::new(true)),
            answered: Arc::new(AtomicU64::new(NEVER)),
            born: Instant::now(),
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
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        self.seen(self.http.send(req).await)
    }

    /// Sends a request with only the connect timeout; the caller bounds the wait for headers.
    ///
    /// # Errors
    /// [`UpstreamError::Connect`].
    pub(crate) async fn send_untimed(
        &self,
        req: Request<Body>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        self.seen(self.http.send_untimed(req).await)
    }

    // Records whether the upstream could be reached, and says how the request failed.
    fn seen<T>(&self, outcome: Result<T, ClientError>) -> Result<T, UpstreamError> {
        match outcome {
            Ok(resp) => {
                self.reachable.store(true, Ordering::Relaxed);
                self.answered.store(self.since_born(), Ordering::Relaxed);
                Ok(resp)
            }
            Err(ClientError::Unreachable(why)) => {
                self.reachable.store(false, Ordering::Relaxed);
                Err(UpstreamError::Connect(why))
            }
            Err(ClientError::Broken(why)) => Err(UpstreamError::Connect(why)),
            Err(ClientError::Timeout) => Err(UpstreamError::Timeout),
        }
    }

    /// Closes idle connections kept longer than they may be.
    pub(crate) fn close_idle(&self) {
        self.http.close_idle();
    }

    /// False since the last attempt to reach the upstream failed to connect.
    pub(crate) fn is_reachable(&self) -> bool {
        self.reachable.load(Ordering::Relaxed)
    }

    /// The liveness check readiness follows between requests: whether the upstream answered a
    /// request within `recently` and no connection failed since, else whether a TCP connection
    /// to it opens (opened and closed now). Records and returns the answer.
    ///
    /// Traffic is the check while there is any: a connect is not free where the proxy holds
    /// many connections to the upstream. With 9 800 calls parked (two connections each) the
    /// kernel spent ~4 ms finding a free local port for each, on the runtime's thread, and
    /// every request waited (issue 26, lever 5: the capacity phase's stalls).
    pub(crate) async fn check_connect(&self, recently: Duration) -> bool {
        let answered = self.answered.load(Ordering::Relaxed);
        let within = u64::try_from(recently.as_millis()).unwrap_or(u64::MAX);
        let lately = answered != NEVER && self.since_born().saturating_sub(answered) < within;
        if lately && self.is_reachable() {
            return true;
        }
        let ok = self.http.check_connect().await;
        self.reachable.store(ok, Ordering::Relaxed);
        ok
    }

    // Milliseconds since the client was made.
    fn since_born(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The configured connect + response-header timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.http.timeout()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error_and_marks_the_upstream_unreachable() {
        // A port nothing listens on: bound, then closed.
        let addr = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let uri: Uri = format!("http://{addr}/mcp").parse().unwrap();
        let c = UpstreamClient::new(uri.clone(), Duration::from_secs(10), 1 << 20, 8);
        let req = Request::get(uri).body(crate::body::empty()).unwrap();
        let err = c.send(req).await.unwrap_err();
        assert!(matches!(err, UpstreamError::Connect(_)), "{err:?}");
        assert!(!c.is_reachable());
        assert!(!c.check_connect(Duration::from_secs(60)).await);
    }

    // An upstream that answers every request with 200, until the returned handle is aborted
    // (its listener closed: connections are refused from then on).
    async fn upstream() -> (Uri, tokio::task::JoinHandle<()>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: Uri = format!("http://{}/mcp", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let serving = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                        if conn.write_all(ok).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        (uri, serving)
    }

    #[tokio::test]
    async fn an_upstream_that_answered_lately_is_not_connected_to_for_the_check() {
        let (uri, serving) = upstream().await;
        let c = UpstreamClient::new(uri.clone(), Duration::from_secs(10), 1 << 20, 8);
        let req = Request::get(uri).body(crate::body::empty()).unwrap();
        assert_eq!(c.send(req).await.unwrap().status(), StatusCode::OK);
        // From here a connection would be refused: a check that connected would fail.
        serving.abort();
        let _ = serving.await;
        let minute = Duration::from_secs(60);
        assert!(c.check_connect(minute).await, "the answer is the check");
        assert!(
            !c.check_connect(Duration::ZERO).await,
            "not answered within: connects"
        );
        assert!(!c.is_reachable());
        assert!(
            !c.check_connect(minute).await,
            "a failed connection since: connects"
        );
    }

    #[tokio::test]
    async fn a_check_before_any_answer_connects() {
        let (uri, serving) = upstream().await;
        let c = UpstreamClient::new(uri, Duration::from_secs(10), 1 << 20, 8);
        serving.abort();
        let _ = serving.await;
        assert!(!c.check_connect(Duration::from_secs(60)).await);
    }
}
