//! The HTTP client for one origin, for every request the proxy makes itself: to the upstream
//! (`upstream::client` wraps it), to a peer (`cluster`, one per peer), to its own probe
//! (`healthcheck`) and from the demo client.
//!
//! One origin, HTTP/1.1, so the client is hyper's connection API and a stack of idle
//! connections (`idle`), not a general pool: a connection goes back on the stack when its
//! response body ends (a body dropped before its end closes it), a request takes the most
//! recently used one (or connects), and one refused before it was sent is tried once more on a
//! new connection. hyper-util's pool did the same for any number of origins, hashing the
//! origin on every checkout and every return (`docs/BENCHMARKS.md`).

use std::sync::Arc;
use std::time::Duration;

use http::header::HOST;
use http::{HeaderValue, Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;

use crate::body::Body;

mod idle;

use idle::Idle;
pub(crate) use idle::ResponseBody;

/// A connector for any origin, http or https (rustls with the Mozilla roots): for the rare
/// requests outside the one-origin clients (the authorization server, the trace collector).
pub(crate) fn https_connector(
) -> hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector> {
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .build()
}

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    /// No connection could be made (refused, unresolvable, timed out, handshake failed).
    #[error("{0}")]
    Unreachable(String),
    /// The connection broke before the response headers.
    #[error("{0}")]
    Broken(String),
    /// No response headers within the timeout.
    #[error("timed out")]
    Timeout,
}

/// HTTP/1.1 client for one origin; cheap to clone (the idle stack is shared).
#[derive(Debug, Clone)]
pub(crate) struct OriginClient {
    idle: Arc<Idle>,
    /// `Host` for every request: the origin's authority.
    host: HeaderValue,
    /// Where the origin listens.
    addr: (String, u16),
    timeout: Duration,
}

impl OriginClient {
    /// A client for the origin of `uri`, waiting at most `timeout` to connect and for response
    /// headers, keeping at most `max_idle` idle connections.
    pub(crate) fn new(uri: &Uri, timeout: Duration, max_idle: usize) -> Self {
        let authority = uri.authority().map_or("localhost", |a| a.as_str());
        let host = HeaderValue::from_str(authority)
            .unwrap_or_else(|_| HeaderValue::from_static("localhost"));
        // `[::1]` in a URL is `::1` to connect to.
        let ip_or_name = uri.host().unwrap_or("127.0.0.1");
        let ip_or_name = ip_or_name.trim_start_matches('[').trim_end_matches(']');
        let addr = (ip_or_name.to_owned(), uri.port_u16().unwrap_or(80));
        Self {
            idle: Arc::new(Idle::new(max_idle)),
            host,
            addr,
            timeout,
        }
    }

    /// The connect + response-header timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sends a request; waits at most the timeout for the response headers.
    ///
    /// # Errors
    /// [`ClientError`] saying how it failed.
    pub(crate) async fn send(
        &self,
        req: Request<Body>,
    ) -> Result<Response<ResponseBody>, ClientError> {
        match tokio::time::timeout(self.timeout, self.send_untimed(req)).await {
            Ok(r) => r,
            Err(_) => Err(ClientError::Timeout),
        }
    }

    /// Sends a request with only the connect timeout; the caller bounds the wait for headers.
    ///
    /// # Errors
    /// [`ClientError::Unreachable`] or [`ClientError::Broken`].
    pub(crate) async fn send_untimed(
        &self,
        mut req: Request<Body>,
    ) -> Result<Response<ResponseBody>, ClientError> {
        // Origin-form with a `Host`, as an HTTP/1.1 request to an origin server is written.
        req.headers_mut()
            .entry(HOST)
            .or_insert_with(|| self.host.clone());
        if req.uri().scheme().is_some() {
            let mut origin = http::uri::Parts::default();
            origin.path_and_query = req.uri().path_and_query().cloned();
            *req.uri_mut() = Uri::from_parts(origin).unwrap_or_else(|_| Uri::from_static("/"));
        }
        // A connection from the stack may have been closed by the origin while idle: a
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
                    Err((e, _)) => Err(ClientError::Broken(e.to_string())),
                }
            }
            _ => Err(ClientError::Broken(error.to_string())),
        }
    }

    fn checked_out(
        &self,
        resp: Response<Incoming>,
        conn: SendRequest<Body>,
    ) -> Response<ResponseBody> {
        resp.map(|body| ResponseBody::new(body, conn, &self.idle))
    }

    // A new connection (bounded by the timeout), its task spawned.
    async fn connect(&self) -> Result<SendRequest<Body>, ClientError> {
        let (host, port) = (self.addr.0.as_str(), self.addr.1);
        let stream =
            match tokio::time::timeout(self.timeout, tokio::net::TcpStream::connect((host, port)))
                .await
            {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    return Err(ClientError::Unreachable(format!("tcp connect error: {e}")))
                }
                Err(_) => return Err(ClientError::Unreachable("tcp connect timed out".into())),
            };
        // Small JSON-RPC writes: Nagle would hold them behind delayed ACKs.
        let _ = stream.set_nodelay(true);
        let (conn, task) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ClientError::Unreachable(e.to_string()))?;
        // Polled in place: an `async` block awaiting it would hold the connection twice (as
        // captured and as awaited), 672 bytes more in every connection's task.
        let mut task = task;
        tokio::spawn(std::future::poll_fn(move |cx| {
            std::future::Future::poll(std::pin::Pin::new(&mut task), cx).map(|ended| {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "outbound connection ended with an error");
                }
            })
        }));
        Ok(conn)
    }

    /// Closes idle connections kept longer than they may be.
    pub(crate) fn close_idle(&self) {
        self.idle.close_timed_out();
    }

    /// Opens (and closes) a TCP connection to the origin: whether it connected in time.
    pub(crate) async fn check_connect(&self) -> bool {
        let connect = tokio::net::TcpStream::connect((self.addr.0.as_str(), self.addr.1));
        matches!(tokio::time::timeout(self.timeout, connect).await, Ok(Ok(_)))
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
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http::StatusCode;
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

    fn client(uri: &Uri) -> OriginClient {
        OriginClient::new(uri, Duration::from_secs(10), 8)
    }

    // Lets the connection tasks run until `idle` holds `n` connections (bounded).
    async fn until_idle(c: &OriginClient, n: usize) {
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
        let c = client(&uri);
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
        let c = client(&uri);
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
        let c = client(&uri);
        let mut body = c.send(get(&uri)).await.unwrap().into_body();
        let _ = body.frame().await.unwrap().unwrap();
        drop(body);
        let resp = c.send(get(&uri)).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"hello");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_refused_connection_is_unreachable() {
        // A port nothing listens on: bound, then closed.
        let addr = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let uri: Uri = format!("http://{addr}/mcp").parse().unwrap();
        let c = client(&uri);
        let err = c.send(get(&uri)).await.unwrap_err();
        assert!(matches!(err, ClientError::Unreachable(_)), "{err:?}");
    }

    #[tokio::test]
    async fn a_bracketed_ipv6_origin_is_reached() {
        let listener = TcpListener::bind("[::1]:0").await.unwrap();
        let uri: Uri = format!("http://{}/healthz", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        assert!(uri.host().unwrap().starts_with('['), "{uri}");
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(WHOLE).await;
        });
        let resp = client(&uri).send(get(&uri)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }
}
