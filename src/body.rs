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

/// What [`settle`] gathers of a relayed body at most before it streams the rest.
pub const SETTLE_MAX_BYTES: usize = 64 * 1024;

/// `body` with whatever of it is ready now read up front, after the tasks already woken ran
/// once (the upstream connection's task is the one that finds the end of a body that has
/// arrived whole). A body that ended by then becomes one buffer of known length, so hyper writes
/// the head, the data and the end in one write (`content-length` framing) instead of the head
/// and data first and the closing chunk in a second write that the client waits for. A body
/// still open streams on after what was read: nothing waits for the network, and at most
/// `max_bytes` are held.
pub async fn settle(mut body: Body, max_bytes: usize) -> Body {
    let mut read: Vec<Bytes> = Vec::new();
    let mut held = 0;
    let mut yielded = false;
    let stop = std::future::poll_fn(|cx| loop {
        match Pin::new(&mut body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => {
                    held += data.len();
                    read.push(data);
                    if held >= max_bytes {
                        return Poll::Ready(Stop::Open(None));
                    }
                }
                Err(trailers) => return Poll::Ready(Stop::Open(Some(Ok(trailers)))),
            },
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Stop::Open(Some(Err(e)))),
            Poll::Ready(None) => return Poll::Ready(Stop::Ended),
            // Once: other woken tasks run first (a self-wake queues this task behind them).
            Poll::Pending if !yielded => {
                yielded = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Pending => return Poll::Ready(Stop::Open(None)),
        }
    })
    .await;
    match stop {
        Stop::Ended => match read.len() {
            0 => empty(),
            1 => full(read.swap_remove(0)),
            _ => full(read.concat()),
        },
        Stop::Open(next) => Settled {
            read: read.into(),
            next,
            rest: body,
        }
        .boxed(),
    }
}

/// Where [`settle`] stopped reading: at the end, or with the body still open (and perhaps a
/// trailers frame or an error taken from it that must still be passed on).
enum Stop {
    Ended,
    Open(Option<Result<Frame<Bytes>, BoxError>>),
}

/// A body [`settle`] read part of: what was read, then the rest as it comes.
struct Settled {
    read: std::collections::VecDeque<Bytes>,
    next: Option<Result<Frame<Bytes>, BoxError>>,
    rest: Body,
}

impl HttpBody for Settled {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(data) = self.read.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(next) = self.next.take() {
            return Poll::Ready(Some(next));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(s: &'static str) -> Bytes {
        Bytes::from_static(s.as_bytes())
    }

    #[tokio::test]
    async fn a_body_that_has_ended_is_settled_into_one_buffer_of_known_length() {
        let (tx, body) = ChannelBody::channel(4);
        tx.send(chunk("event: message\n")).await.unwrap();
        tx.send(chunk("data: {}\n\n")).await.unwrap();
        drop(tx);
        let settled = settle(body, SETTLE_MAX_BYTES).await;
        assert_eq!(
            settled.size_hint().exact(),
            Some(25),
            "hyper can frame it by length"
        );
        let all = settled.collect().await.unwrap().to_bytes();
        assert_eq!(&all[..], b"event: message\ndata: {}\n\n");
    }

    #[tokio::test]
    async fn an_empty_ended_body_is_settled_empty() {
        let (tx, body) = ChannelBody::channel(1);
        drop(tx);
        let settled = settle(body, SETTLE_MAX_BYTES).await;
        assert_eq!(settled.size_hint().exact(), Some(0));
    }

    #[tokio::test]
    async fn a_body_still_open_hands_over_what_was_read_and_streams_the_rest() {
        let (tx, body) = ChannelBody::channel(4);
        tx.send(chunk("first")).await.unwrap();
        // Returns with the sender still open: nothing waits for more.
        let mut settled = settle(body, SETTLE_MAX_BYTES).await;
        assert_eq!(settled.size_hint().exact(), None);
        let f = settled.frame().await.unwrap().unwrap();
        assert_eq!(f.into_data().unwrap(), chunk("first"));
        tx.send(chunk("second")).await.unwrap();
        drop(tx);
        let rest = settled.collect().await.unwrap().to_bytes();
        assert_eq!(&rest[..], b"second");
    }

    #[tokio::test]
    async fn settling_reads_no_more_than_the_bound_before_streaming() {
        let (tx, body) = ChannelBody::channel(4);
        for c in ["0123456789", "abcdefghij", "KLMNOPQRST"] {
            tx.send(chunk(c)).await.unwrap();
        }
        drop(tx);
        // 20 bytes read reach the bound of 15: the third chunk is left to stream.
        let mut settled = settle(body, 15).await;
        assert_eq!(settled.size_hint().exact(), None);
        let mut frames = Vec::new();
        while let Some(f) = settled.frame().await {
            frames.push(f.unwrap().into_data().unwrap());
        }
        assert_eq!(
            frames,
            [
                chunk("0123456789"),
                chunk("abcdefghij"),
                chunk("KLMNOPQRST")
            ]
        );
    }

    #[tokio::test]
    async fn trailers_and_errors_met_while_settling_are_passed_on_in_order() {
        let frames: Vec<Result<Frame<Bytes>, BoxError>> = vec![
            Ok(Frame::data(chunk("data"))),
            Ok(Frame::trailers(http::HeaderMap::new())),
            Err("upstream broke".into()),
        ];
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed();
        let mut settled = settle(body, SETTLE_MAX_BYTES).await;
        let f = settled.frame().await.unwrap().unwrap();
        assert_eq!(f.into_data().unwrap(), chunk("data"));
        assert!(settled.frame().await.unwrap().unwrap().is_trailers());
        assert!(settled.frame().await.unwrap().is_err());
    }
}
