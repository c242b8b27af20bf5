//! Response bodies: one boxed body type for everything the proxy sends, plus a channel-fed body
//! for SSE streams whose drop tells the producer that the client went away.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame};
use http_body_util::{BodyExt, Empty, Full};
use tokio::sync::mpsc;

/// Boxed error used in bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body type of every response the proxy sends and every request it forwards.
pub type Body = http_body_util::combinators::BoxBody<Bytes, BoxError>;

/// A body holding `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// An empty body.
pub fn empty() -> Body {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}

/// `body`, keeping `guard` alive until the body ends or is dropped (a permit that must last
/// as long as a streamed answer).
pub fn hold<G: Send + Sync + 'static>(body: Body, guard: G) -> Body {
    body.map_frame(move |frame| {
        let _held = &guard;
        frame
    })
    .boxed()
}

/// A streaming body fed by an mpsc channel; the stream ends when every sender is dropped.
#[derive(Debug)]
pub struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl ChannelBody {
    /// A bounded channel and the body reading from it.
    pub fn channel(capacity: usize) -> (mpsc::Sender<Bytes>, Body) {
        let (tx, rx) = mpsc::channel(capacity);
        (tx, Self { rx }.boxed())
    }
}

impl HttpBody for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}
