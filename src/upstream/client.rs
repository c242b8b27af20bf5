//! The HTTP client for the one configured upstream, and how talking to it fails.
//!
//! One origin, HTTP/1.1, so the client is hyper's connection API and a stack of idle
//! connections, not a general pool: a connection goes back on the stack when its response body
//! ends (a body dropped before its end closes it), a request takes the most recently used one
//! (or connects), and one refused before it was sent is tried once more on a new connection.
//! hyper-util's pool did the same for any number of origins, hashing the origin on every
//! checkout and every return (~8k instructions a request, `docs/BENCHMARKS.md`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::header::HOST;
use http::{HeaderValue, Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;

use crate::body::Body;
use crate::sse::SseError;

mod idle;

use idle::Idle;
pub(crate) use idle::UpstreamBody;

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
    idle: Arc<Idle>,
    uri: Uri,
    /// `Host` for every request: the URI's authority.
    host: HeaderValue,
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
        let authority = uri.authority().map_or("localhost", |a| a.as_str());
        let host = HeaderValue::from_str(authority)
            .unwrap_or_else(|_| HeaderValue::from_static("localhost"));
        Self {
            idle: Arc::new(Idle::new(max_idle)),
            uri,
            host,
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
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
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
        mut req: Request<Body>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        // Origin-form with a `Host`, as an HTTP/1.1 request to an origin server is written.
        req.headers_mut()
            .entry(HOST)
            .or_insert_with(|| self.host.clone());
        if req.uri().scheme().is_some() {
            let mut origin = http::uri::Parts::default();
            origin.path_and_query = req.uri().path_and_query().cloned();
            *req.uri_mut() = Uri::from_parts(origin).unwrap_or_else(|_| Uri::from_static("/"));
        }
        // A connection from the stack may have been closed by the upstream while idle: a
        // request it refused unsent goes once more, on a new connection.
        let (mut conn, reused) = match self.idle.take() {
            Some(c) => (c, true),
            None => (self.connect().await?, false),
        };
        let (error, unsent) = match ready_then_send(&mut conn, req).await {
            Ok(resp) => return Ok(self.checked_out(resp, conn)),
            Err(failed) => failed,
        };
        match unsent {
            Some(req) if reused => {
                let mut conn = self.connect().await?;
                match ready_then_send(&mut conn, req).await {
                    Ok(resp) => Ok(self.checked_out(resp, conn)),
                    Err((e, _)) => Err(UpstreamError::Connect(e.to_string())),
                }
            }
            _ => Err(UpstreamError::Connect(error.to_string())),
        }
    }

    fn checked_out(
        &self,
        resp: Response<Incoming>,
        conn: SendRequest<Body>,
    ) -> Response<UpstreamBody> {
        self.reachable.store(true, Ordering::Relaxed);
        resp.map(|body| UpstreamBody::new(body, conn, &self.idle))
    }

    // Where the upstream listens.
    fn addr(&self) -> (&str, u16) {
        (
            self.uri.host().unwrap_or("127.0.0.1"),
            self.uri.port_u16().unwrap_or(80),
        )
    }

    // A new connection (bounded by the timeout), its task spawned.
    async fn connect(&self) -> Result<SendRequest<Body>, UpstreamError> {
        let stream =
            match tokio::time::timeout(self.timeout, tokio::net::TcpStream::connect(self.addr()))
                .await
            {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return Err(self.unreachable(format!("tcp connect error: {e}"))),
                Err(_) => return Err(self.unreachable("tcp connect timed out".into())),
            };
        // Small JSON-RPC writes: Nagle would hold them behind delayed ACKs.
        let _ = stream.set_nodelay(true);
        let (conn, task) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.unreachable(e.to_string()))?;
        tokio::spawn(async move {
            if let Err(e) = task.await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(conn)
    }

    fn unreachable(&self, why: String) -> UpstreamError {
        self.reachable.store(false, Ordering::Relaxed);
        UpstreamError::Connect(why)
    }

    /// Closes idle connections kept longer than they may be.
    pub(crate) fn close_idle(&self) {
        self.idle.close_timed_out();
    }

    /// False since the last attempt to reach the upstream failed to connect.
    pub(crate) fn is_reachable(&self) -> bool {
        self.reachable.load(Ordering::Relaxed)
    }

    /// Opens (and closes) a TCP connection to the upstream: the cheap liveness check readiness
    /// follows between requests. Records and returns whether it connected.
    pub(crate) async fn check_connect(&self) -> bool {
        let connect = tokio::net::TcpStream::connect(self.addr());
        let ok = matches!(tokio::time::timeout(self.timeout, connect).await, Ok(Ok(_)));
        self.reachable.store(ok, Ordering::Relaxed);
        ok
    }

    /// The configured connect + response-header timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }
}

// Waits for `conn` to take a request, then sends `req`; on failure, the error and the request
// if it was never written (so it can go on another connection).
async fn ready_then_send(
    conn: &mut SendRequest<Body>,
    req: Request<Body>,
) -> Result<Response<Incoming>, (hyper::Error, Option<Request<Body>>)> {
    if let Err(e) = conn.ready().await {
        return Err((e, Some(req)));
    }
    conn.try_send_request(req).await.map_err(|mut e| {
        let unsent = e.take_message();
        (e.into_error(), unsent)
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    const WHOLE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    const CUT_SHORT: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n";

    // A keep-alive server on loopback: the `n`th connection answers every request with
    // `answer(n)`; returns the URL and how many connections it accepted.
    async fn server(answer: fn(usize) -> &'static [u8]) -> (Uri, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: Uri = format!("http://{}/mcp", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let n = count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while let Ok(read) = s.read(&mut chunk).await {
                        if read == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..read]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            if s.write_all(answer(n)).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (uri, accepted)
    }

    fn get(uri: &Uri) -> Request<Body> {
        Request::get(uri.clone())
            .body(crate::body::empty())
            .unwrap()
    }

    fn client(uri: Uri) -> UpstreamClient {
        UpstreamClient::new(uri, Duration::from_secs(10), 1 << 20, 8)
    }

    // Lets the connection tasks run until `idle` holds `n` connections (bounded).
    async fn until_idle(c: &UpstreamClient, n: usize) {
        for _ in 0..1000 {
            if c.idle.len() == n {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the idle stack never held {n} connections");
    }

    #[tokio::test]
    async fn a_connection_is_reused_once_its_response_was_read_to_the_end() {
        let (uri, accepted) = server(|_| WHOLE).await;
        let c = client(uri.clone());
        for _ in 0..3 {
            let resp = c.send(get(&uri)).await.unwrap();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"hello");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_body_dropped_after_its_message_but_before_its_end_keeps_its_connection() {
        let (uri, accepted) = server(|_| WHOLE).await;
        let c = client(uri.clone());
        let mut body = c.send(get(&uri)).await.unwrap().into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"hello");
        drop(body);
        until_idle(&c, 1).await;
        let resp = c.send(get(&uri)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_body_dropped_mid_stream_closes_its_connection_and_the_next_request_connects() {
        let (uri, accepted) = server(|n| if n == 0 { CUT_SHORT } else { WHOLE }).await;
        let c = client(uri.clone());
        let mut body = c.send(get(&uri)).await.unwrap().into_body();
        let _ = body.frame().await.unwrap().unwrap();
        drop(body);
        let resp = c.send(get(&uri)).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"hello");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error_and_marks_the_upstream_unreachable() {
        // A port nothing listens on: bound, then closed.
        let addr = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let uri: Uri = format!("http://{addr}/mcp").parse().unwrap();
        let c = client(uri.clone());
        let err = c.send(get(&uri)).await.unwrap_err();
        assert!(matches!(err, UpstreamError::Connect(_)), "{err:?}");
        assert!(!c.is_reachable());
    }
}
