//! One client exchange with a call ("leg"): the first request or a retry. The actor writes
//! [`LegEvent`]s to it; the HTTP edge turns them into a JSON or SSE response.

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::error::{Failure, ProxyError};

/// How many events a leg buffers before the actor waits for the client to read.
const LEG_BUFFER: usize = 64;

/// One client HTTP exchange with the call.
#[derive(Debug)]
pub(crate) struct Leg {
    /// The JSON-RPC id of this exchange.
    pub(crate) id: Box<RawValue>,
    /// Where the actor sends events.
    pub(crate) tx: mpsc::Sender<LegEvent>,
    /// `_meta.progressToken` of this exchange.
    pub(crate) progress_token: Option<Value>,
    /// `io.modelcontextprotocol/logLevel` of this exchange.
    pub(crate) log_level: Option<String>,
    /// The request's span (where the actor records what it does for this exchange).
    pub(crate) span: tracing::Span,
}

/// What the actor sends to the current leg.
#[derive(Debug)]
pub(crate) enum LegEvent {
    /// A request-scoped notification (already encoded JSON-RPC).
    Message(Bytes),
    /// The last message of this exchange.
    Done(Outcome),
}

/// The last message of an exchange and the HTTP status it implies when it comes first.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// HTTP status if the response is still JSON.
    pub(crate) status: StatusCode,
    /// The JSON-RPC message.
    pub(crate) body: Bytes,
    /// Headers besides the content type (`Retry-After`, `WWW-Authenticate`).
    pub(crate) headers: HeaderMap,
    /// Why the exchange failed, logged once by the edge; `None` for a result.
    pub(crate) failure: Option<Failure>,
    /// The round number, when this is an `input_required` round.
    pub(crate) round: Option<u32>,
    /// The HTTP status of the upstream response that carried the final message, if any.
    pub(crate) upstream_status: Option<u16>,
    /// This is a `CreateTaskResult`.
    pub(crate) task: bool,
}

impl Outcome {
    /// A result for the client, carried by an upstream response of `upstream_status`.
    pub(crate) fn result(body: Vec<u8>, upstream_status: Option<u16>) -> Self {
        Self {
            status: StatusCode::OK,
            body: Bytes::from(body),
            headers: HeaderMap::new(),
            failure: None,
            round: None,
            upstream_status,
            task: false,
        }
    }

    /// Round `number`'s `input_required` result.
    pub(crate) fn round(body: Vec<u8>, number: u32) -> Self {
        Self {
            round: Some(number),
            ..Self::result(body, None)
        }
    }

    /// A `CreateTaskResult`: the call goes on as a task.
    pub(crate) fn task(body: Vec<u8>) -> Self {
        Self {
            task: true,
            ..Self::result(body, None)
        }
    }

    /// `err`, as the answer to request `id`.
    pub(crate) fn error(err: &ProxyError, id: &RawValue) -> Self {
        Self {
            status: err.status(),
            body: err.to_body_bytes(Some(id)),
            headers: err.extra_headers(),
            failure: Some(Failure::of(err)),
            round: None,
            upstream_status: None,
            task: false,
        }
    }
}

impl Leg {
    /// A new leg for request `id` (of the current span), and the receiver the edge answers the
    /// client from.
    pub(crate) fn open(
        id: Box<RawValue>,
        progress_token: Option<Value>,
        log_level: Option<String>,
    ) -> (Self, mpsc::Receiver<LegEvent>) {
        let (tx, rx) = mpsc::channel(LEG_BUFFER);
        let leg = Self {
            id,
            tx,
            progress_token,
            log_level,
            span: tracing::Span::current(),
        };
        (leg, rx)
    }

    /// Ends the exchange with `outcome` (a client that left is noticed by the actor's loop).
    pub(crate) async fn finish(self, outcome: Outcome) {
        let _ = self.tx.send(LegEvent::Done(outcome)).await;
    }

    /// Sends a request-scoped notification (progress, a log message) without waiting: `false`
    /// when the client has not read the leg's buffer (it is dropped then) or left. Only the
    /// final message waits for the client, so a client that stops reading never holds the call.
    pub(crate) fn notify(&self, message: Vec<u8>) -> bool {
        self.tx
            .try_send(LegEvent::Message(Bytes::from(message)))
            .is_ok()
    }

    /// Resolves when the client closed this exchange's response.
    pub(crate) async fn closed(&self) {
        self.tx.closed().await;
    }
}
