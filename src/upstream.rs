//! Talking to the legacy upstream: the HTTP client, the reader that turns a JSON or SSE response
//! body into JSON-RPC messages, and (in submodules) legacy sessions and their pool.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::body::Body;
use crate::sse::{SseDecoder, SseError};

pub mod changes;
pub mod pool;
pub mod session;

pub use pool::{Lease, PoolKey, SessionPool};
pub use session::Session;

/// A failure talking to the upstream.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// Could not connect or the connection broke.
    #[error("upstream unreachable: {0}")]
    Connect(String),
    /// No response headers within the configured timeout.
    #[error("upstream timed out")]
    Timeout,
    /// An HTTP status we cannot use.
    #[error("upstream answered http {0}")]
    Status(StatusCode),
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
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Timeout => StatusCode::GATEWAY_TIMEOUT,
            Self::Unauthorized { status, .. } => *status,
            _ => StatusCode::BAD_GATEWAY,
        }
    }

    /// The error for an upstream response with an unusable status.
    pub fn from_status<B>(resp: &Response<B>) -> Self {
        let status = resp.status();
        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            Self::Unauthorized {
                status,
                challenge: resp.headers().get(http::header::WWW_AUTHENTICATE).cloned(),
            }
        } else {
            Self::Status(status)
        }
    }
}

/// HTTP client for the one configured upstream.
#[derive(Debug, Clone)]
pub struct UpstreamClient {
    http: Client<HttpConnector, Body>,
    uri: Uri,
    timeout: Duration,
    max_event_bytes: usize,
}

impl UpstreamClient {
    /// A client for `uri`.
    pub fn new(uri: Uri, timeout: Duration, max_event_bytes: usize) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        connector.set_nodelay(true);
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Self {
            http,
            uri,
            timeout,
            max_event_bytes,
        }
    }

    /// The upstream MCP endpoint.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// Largest accepted SSE event / JSON body.
    pub fn max_event_bytes(&self) -> usize {
        self.max_event_bytes
    }

    /// Sends a request; waits at most the configured timeout for the response headers.
    ///
    /// # Errors
    /// [`UpstreamError::Connect`] or [`UpstreamError::Timeout`].
    pub async fn send(&self, req: Request<Body>) -> Result<Response<Incoming>, UpstreamError> {
        match tokio::time::timeout(self.timeout, self.send_untimed(req)).await {
            Ok(r) => r,
            Err(_) => Err(UpstreamError::Timeout),
        }
    }

    /// Sends a request with only the connect timeout; the caller bounds the wait for headers.
    ///
    /// # Errors
    /// [`UpstreamError::Connect`].
    pub async fn send_untimed(
        &self,
        req: Request<Body>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        self.http
            .request(req)
            .await
            .map_err(|e| UpstreamError::Connect(e.to_string()))
    }

    /// The configured connect + response-header timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// The response to a request whose headers may still be on the way, then its messages.
///
/// A JSON-mode upstream sends no headers until the request is done, and may meanwhile ask for
/// input on the session's GET stream; the call actor must keep serving that stream while it
/// waits, so the wait lives here, polled with everything else (cancel-safe: the pending future
/// is kept across polls).
pub enum ResponseStream {
    /// Headers not yet received.
    Pending(Pin<Box<dyn Future<Output = Result<MessageStream, UpstreamError>> + Send>>),
    /// Reading the body.
    Ready(MessageStream),
    /// Ended by an error while waiting for the headers.
    Failed,
}

impl std::fmt::Debug for ResponseStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pending(_) => f.write_str("ResponseStream::Pending"),
            Self::Ready(s) => f.debug_tuple("ResponseStream::Ready").field(s).finish(),
            Self::Failed => f.write_str("ResponseStream::Failed"),
        }
    }
}

impl ResponseStream {
    /// The next message, `None` at the end of the body.
    ///
    /// # Errors
    /// As [`MessageStream::next`], plus the errors of waiting for the headers.
    pub async fn next(&mut self) -> Option<Result<Bytes, UpstreamError>> {
        loop {
            match self {
                Self::Pending(headers) => match headers.as_mut().await {
                    Ok(stream) => *self = Self::Ready(stream),
                    Err(e) => {
                        *self = Self::Failed;
                        return Some(Err(e));
                    }
                },
                Self::Ready(stream) => return stream.next().await,
                Self::Failed => return None,
            }
        }
    }
}

/// Yields the JSON-RPC messages of one upstream response body, JSON or SSE, as raw bytes.
#[derive(Debug)]
pub struct MessageStream {
    body: Incoming,
    mode: Mode,
    queue: std::collections::VecDeque<Bytes>,
    done: bool,
}

#[derive(Debug)]
enum Mode {
    Sse(SseDecoder),
    Json { buf: BytesMut, limit: usize },
}

impl MessageStream {
    /// Wraps a response; the content type picks JSON or SSE.
    pub fn new(resp: Response<Incoming>, max_event_bytes: usize) -> Self {
        let sse = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mode = if sse {
            Mode::Sse(SseDecoder::new(max_event_bytes))
        } else {
            Mode::Json {
                buf: BytesMut::new(),
                limit: max_event_bytes,
            }
        };
        Self {
            body: resp.into_body(),
            mode,
            queue: Default::default(),
            done: false,
        }
    }

    /// The next message, `None` at the end of the body.
    ///
    /// # Errors
    /// Transport failures and SSE bound violations; the stream is finished after an error.
    pub async fn next(&mut self) -> Option<Result<Bytes, UpstreamError>> {
        loop {
            if let Some(m) = self.queue.pop_front() {
                return Some(Ok(m));
            }
            if self.done {
                return None;
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    if let Err(e) = self.push(&data) {
                        self.done = true;
                        return Some(Err(e));
                    }
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(UpstreamError::Connect(e.to_string())));
                }
                None => {
                    self.done = true;
                    if let Mode::Json { buf, .. } = &mut self.mode {
                        let body = buf.split().freeze();
                        if !body.iter().all(u8::is_ascii_whitespace) {
                            self.queue.push_back(body);
                        }
                    }
                }
            }
        }
    }

    fn push(&mut self, data: &[u8]) -> Result<(), UpstreamError> {
        match &mut self.mode {
            Mode::Sse(dec) => {
                for ev in dec.feed(data)? {
                    if ev.event.as_deref().is_none_or(|e| e == "message") {
                        self.queue.push_back(Bytes::from(ev.data));
                    }
                }
            }
            Mode::Json { buf, limit } => {
                if buf.len() + data.len() > *limit {
                    return Err(UpstreamError::Sse(SseError::EventTooLarge {
                        limit: *limit,
                    }));
                }
                buf.extend_from_slice(data);
            }
        }
        Ok(())
    }
}
