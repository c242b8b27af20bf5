//! Reading an upstream response: the JSON or SSE body of one request turned into JSON-RPC
//! messages, and the wait for its headers kept pollable beside everything else.

use std::future::Future;
use std::pin::Pin;

use bytes::{Bytes, BytesMut};
use http::Response;
use http_body_util::BodyExt;

use super::client::{UpstreamBody, UpstreamError};
use super::link::Routed;
use crate::sse::{SseDecoder, SseError};

/// The response to a request whose headers may still be on the way, then its messages.
///
/// A JSON-mode upstream sends no headers until the request is done, and may meanwhile ask for
/// input on the session's GET stream; the call actor must keep serving that stream while it
/// waits, so the wait lives here, polled with everything else (cancel-safe: the pending future
/// is kept across polls).
#[expect(
    clippy::large_enum_variant,
    reason = "one per call, inside its actor: boxing the ready stream would add an allocation per request"
)]
pub(crate) enum ResponseStream {
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
    /// When the body last delivered bytes (events and keep-alive comments alike), once the
    /// headers came.
    pub(crate) fn last_activity(&self) -> Option<tokio::time::Instant> {
        match self {
            Self::Ready(s) => Some(s.last_activity()),
            Self::Pending(_) | Self::Failed => None,
        }
    }

    /// The HTTP status of the response, once its headers came.
    pub(crate) fn status(&self) -> Option<http::StatusCode> {
        match self {
            Self::Ready(s) => Some(s.status()),
            Self::Pending(_) | Self::Failed => None,
        }
    }

    /// The next message, `None` at the end of the body.
    ///
    /// # Errors
    /// As [`MessageStream::next`], plus the errors of waiting for the headers.
    pub(crate) async fn next(&mut self) -> Option<Result<Bytes, UpstreamError>> {
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

/// Yields the JSON-RPC messages of one upstream response body, JSON or SSE, as raw bytes; or,
/// on a stdio or HTTP+SSE session, the messages its link routed to the request.
#[derive(Debug)]
pub(crate) struct MessageStream {
    status: http::StatusCode,
    body: Source,
    mode: Mode,
    queue: std::collections::VecDeque<Bytes>,
    done: bool,
    last_activity: tokio::time::Instant,
}

#[derive(Debug)]
enum Source {
    Http(UpstreamBody),
    Link(Routed),
}

#[derive(Debug)]
enum Mode {
    Sse(SseDecoder),
    Json { buf: BytesMut, limit: usize },
}

impl MessageStream {
    /// Wraps a response; the content type picks JSON or SSE.
    pub(crate) fn new(resp: Response<UpstreamBody>, max_event_bytes: usize) -> Self {
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
            status: resp.status(),
            body: Source::Http(resp.into_body()),
            mode,
            queue: Default::default(),
            done: false,
            last_activity: tokio::time::Instant::now(),
        }
    }

    /// The messages a link routes to one request (they come whole: nothing to decode).
    pub(crate) fn routed(routed: Routed) -> Self {
        Self {
            status: http::StatusCode::OK,
            body: Source::Link(routed),
            mode: Mode::Json {
                buf: BytesMut::new(),
                limit: 0,
            },
            queue: Default::default(),
            done: false,
            last_activity: tokio::time::Instant::now(),
        }
    }

    /// The HTTP status of the response (200 for a routed stream).
    pub(crate) fn status(&self) -> http::StatusCode {
        self.status
    }

    /// When the upstream last sent bytes: on this body, or on the link (any message or keep-alive
    /// on the one stream a stdio or HTTP+SSE session has counts).
    pub(crate) fn last_activity(&self) -> tokio::time::Instant {
        match &self.body {
            Source::Http(_) => self.last_activity,
            Source::Link(r) => r.link.last_read().max(self.last_activity),
        }
    }

    /// The next message, `None` at the end of the body.
    ///
    /// # Errors
    /// Transport failures and SSE bound violations; the stream is finished after an error.
    pub(crate) async fn next(&mut self) -> Option<Result<Bytes, UpstreamError>> {
        loop {
            if let Some(m) = self.queue.pop_front() {
                return Some(Ok(m));
            }
            if self.done {
                return None;
            }
            let body = match &mut self.body {
                Source::Http(body) => body,
                Source::Link(routed) => {
                    let next = routed.rx.recv().await;
                    self.last_activity = tokio::time::Instant::now();
                    if next.is_none() {
                        self.done = true;
                    }
                    return next.map(Ok);
                }
            };
            match body.frame().await {
                Some(Ok(frame)) => {
                    self.last_activity = tokio::time::Instant::now();
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
