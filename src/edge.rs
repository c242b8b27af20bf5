//! The HTTP edge: every response the proxy itself builds. JSON answers, error answers (each
//! failure logged here, once, at its side's level, in the request's span), plain-text admin
//! answers, and the one SSE writer that call results and `subscriptions/listen` share (keep-alive
//! comments, client-gone detection, the streaming headers). It also settles each request once:
//! its metrics, the request span's `outcome`, `round`, `upstream.status`, `duration_ms`, and the
//! access line (`mrtr_proxy::access`, at debug). Relayed legacy traffic is not built here: it
//! passes through `front::relay` untouched.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use serde_json::value::RawValue;
use tokio::sync::mpsc;
use tokio::time::{Instant, Interval};
use tracing::Instrument;

use crate::body::{self, Body, ChannelBody};
use crate::call::{LegEvent, Outcome};
use crate::error::{Failure, ProxyError};
use crate::ops::metrics::{self, RequestTimer, UpstreamFailure};
use crate::sse;

/// SSE events buffered toward a slow client before the producer waits.
const SSE_BUFFER: usize = 16;

/// A JSON answer.
pub(crate) fn json(
    status: StatusCode,
    headers: HeaderMap,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut resp = Response::new(body::full(body));
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// The answer to a failed request `id` (`None`: not known yet), logged once here.
pub(crate) fn error(err: &ProxyError, id: Option<&RawValue>) -> Response<Body> {
    Failure::of(err).log();
    json(err.status(), err.extra_headers(), err.to_body_bytes(id))
}

/// [`error`], and the request settled as failed.
pub(crate) fn fail(timer: RequestTimer, err: &ProxyError, id: Option<&RawValue>) -> Response<Body> {
    let failure = Failure::of(err);
    if crate::ops::telemetry::exporting() {
        // The semantic conventions' `error.type`: the JSON-RPC code.
        let code = err.to_error_object().code;
        let span = tracing::Span::current();
        tracing_opentelemetry::OpenTelemetrySpanExt::set_attribute(
            &span,
            "error.type",
            code.to_string(),
        );
    }
    failure.log();
    settle(timer, Settled::failed(&failure));
    json(err.status(), err.extra_headers(), err.to_body_bytes(id))
}

/// A failure after the answer's head went out (an approved legacy call's stream): logged once,
/// counted, and the JSON-RPC error for request `id` that the stream carries instead.
pub(crate) fn failed_in_stream(
    metrics: &metrics::Metrics,
    err: &ProxyError,
    id: Option<&RawValue>,
) -> Bytes {
    let failure = Failure::of(err);
    failure.log();
    if let Some(kind) = failure.upstream {
        metrics.upstream_failed(kind);
    }
    err.to_body_bytes(id)
}

/// How a request ended, as the edge records it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settled {
    pub(crate) outcome: metrics::Outcome,
    pub(crate) round: Option<u32>,
    pub(crate) upstream_status: Option<u16>,
    pub(crate) upstream_failure: Option<UpstreamFailure>,
}

impl Settled {
    /// Ended with `outcome`, nothing else known.
    pub(crate) fn with(outcome: metrics::Outcome) -> Self {
        Self {
            outcome,
            round: None,
            upstream_status: None,
            upstream_failure: None,
        }
    }

    fn failed(f: &Failure) -> Self {
        Self {
            upstream_failure: f.upstream,
            ..Self::with(f.outcome())
        }
    }

    fn of(out: &Outcome) -> Self {
        let mut s = match &out.failure {
            Some(f) => Self::failed(f),
            None if out.round.is_some() => Self::with(metrics::Outcome::InputRequired),
            None if out.task => Self::with(metrics::Outcome::Task),
            None => Self::with(metrics::Outcome::Complete),
        };
        s.round = out.round;
        s.upstream_status = out.upstream_status;
        s
    }
}

/// Records how the request ended: metrics, the span's fields, one access line.
pub(crate) fn settle(timer: RequestTimer, s: Settled) {
    let elapsed = timer.finish(s.outcome, s.upstream_failure);
    let span = tracing::Span::current();
    span.record("outcome", s.outcome.as_str());
    if crate::ops::telemetry::exporting() {
        tracing_opentelemetry::OpenTelemetrySpanExt::set_attribute(
            &span,
            "mrtr.outcome",
            s.outcome.as_str(),
        );
    }
    span.record("duration_ms", elapsed.as_secs_f64() * 1000.0);
    if let Some(r) = s.round {
        span.record("round", r);
    }
    if let Some(st) = s.upstream_status {
        span.record("upstream.status", st);
    }
    tracing::debug!(target: "mrtr_proxy::access", "answered");
}

/// A short plain-text answer (admin routes).
pub(crate) fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(body::full(body));
    *r.status_mut() = status;
    r
}

/// An answer with no body (`202 Accepted`, `204 No Content`).
pub(crate) fn empty(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(body::empty());
    *r.status_mut() = status;
    r
}

/// Answers a client exchange from its leg: JSON when the last message comes first, SSE when a
/// notification comes first or nothing comes for `keepalive`; after that, everything (errors
/// included) arrives in the stream.
pub(crate) async fn respond(
    mut rx: mpsc::Receiver<LegEvent>,
    keepalive: Duration,
    timer: RequestTimer,
) -> Response<Body> {
    let first = match tokio::time::timeout(keepalive, rx.recv()).await {
        Ok(Some(LegEvent::Done(out))) => return outcome(out, timer),
        Ok(Some(LegEvent::Message(m))) => Some(m),
        Ok(None) => {
            let err = ProxyError::Internal("the call ended without an answer".into());
            return fail(timer, &err, None);
        }
        Err(_) => None,
    };
    let (writer, resp) = SseWriter::open(keepalive);
    tokio::spawn(stream_leg(writer, first, rx, timer).instrument(tracing::Span::current()));
    resp
}

// Streams the rest of an exchange; ends when it is done or the client left (dropping `rx` then
// tells the actor).
async fn stream_leg(
    mut writer: SseWriter,
    first: Option<Bytes>,
    mut rx: mpsc::Receiver<LegEvent>,
    timer: RequestTimer,
) {
    let cancelled = Settled::with(metrics::Outcome::Cancelled);
    if let Some(m) = first {
        if writer.send(&m).await.is_err() {
            return settle(timer, cancelled);
        }
    }
    loop {
        match writer.pump(rx.recv()).await {
            Ok(Some(LegEvent::Message(m))) => {
                if writer.send(&m).await.is_err() {
                    return settle(timer, cancelled);
                }
            }
            Ok(Some(LegEvent::Done(out))) => {
                if let Some(f) = &out.failure {
                    f.log();
                }
                let settled = Settled::of(&out);
                let _ = writer.send(&out.body).await;
                return settle(timer, settled);
            }
            Ok(None) => return settle(timer, Settled::with(metrics::Outcome::ProxyError)),
            Err(ClientGone) => return settle(timer, cancelled),
        }
    }
}

fn outcome(out: Outcome, timer: RequestTimer) -> Response<Body> {
    if let Some(f) = &out.failure {
        f.log();
    }
    settle(timer, Settled::of(&out));
    json(out.status, out.headers, out.body)
}

/// The client closed the stream.
#[derive(Debug)]
pub(crate) struct ClientGone;

/// Writes one SSE response: JSON-RPC messages as `message` events, keep-alive comments whenever
/// the producer waits longer than the interval.
#[derive(Debug)]
pub(crate) struct SseWriter {
    tx: mpsc::Sender<Bytes>,
    tick: Interval,
}

impl SseWriter {
    /// A writer and the response it feeds (`text/event-stream`, unbuffered by proxies).
    pub(crate) fn open(keepalive: Duration) -> (Self, Response<Body>) {
        let (tx, body) = ChannelBody::channel(SSE_BUFFER);
        let tick = tokio::time::interval_at(Instant::now() + keepalive, keepalive);
        let mut resp = Response::new(body);
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        // nginx and compatible proxies would otherwise hold events back.
        h.insert("x-accel-buffering", HeaderValue::from_static("no"));
        (Self { tx, tick }, resp)
    }

    /// Sends one JSON-RPC message.
    ///
    /// # Errors
    /// [`ClientGone`] once the client closed the stream.
    pub(crate) async fn send(&mut self, message: &[u8]) -> Result<(), ClientGone> {
        self.tx
            .send(sse::encode_message(message))
            .await
            .map_err(|_| ClientGone)
    }

    /// Sends one event named `event` (the `endpoint` of a 2024-11-05 HTTP+SSE stream).
    ///
    /// # Errors
    /// [`ClientGone`] once the client closed the stream.
    pub(crate) async fn send_event(&mut self, event: &str, data: &str) -> Result<(), ClientGone> {
        let text = format!("event: {event}\ndata: {data}\n\n");
        self.tx
            .send(Bytes::from(text))
            .await
            .map_err(|_| ClientGone)
    }

    /// Waits for `next`, sending keep-alive comments meanwhile.
    ///
    /// # Errors
    /// [`ClientGone`] as soon as the client closed the stream (`next` is dropped).
    pub(crate) async fn pump<T>(&mut self, next: impl Future<Output = T>) -> Result<T, ClientGone> {
        tokio::pin!(next);
        loop {
            tokio::select! {
                v = &mut next => return Ok(v),
                _ = self.tick.tick() => {
                    self.tx.send(sse::keepalive()).await.map_err(|_| ClientGone)?;
                }
                () = self.tx.closed() => return Err(ClientGone),
            }
        }
    }
}
