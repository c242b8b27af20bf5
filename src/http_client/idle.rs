//! The one-origin client's idle connections: a stack, the most recently used on top, and the
//! response body that puts its connection back when it ends. Connecting and sending are the
//! client's.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use tokio::time::Instant;

use crate::body::Body;

/// How long an idle connection is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection whose body was dropped unfinished may take to be ready again.
const READY_AFTER_DROP: Duration = Duration::from_secs(5);

/// Idle connections, the most recently used last.
#[derive(Debug)]
pub(super) struct Idle {
    conns: Mutex<Vec<(SendRequest<Body>, Instant)>>,
    /// At most this many are kept: every session ever closed would otherwise leave its
    /// connections (buffers and file descriptors) behind.
    max: usize,
}

impl Idle {
    pub(super) fn new(max: usize) -> Self {
        Self {
            conns: Mutex::new(Vec::new()),
            max,
        }
    }

    /// Idle connections now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.conns.lock().map_or(0, |c| c.len())
    }

    fn put(&self, conn: SendRequest<Body>) {
        if conn.is_closed() {
            return;
        }
        if let Ok(mut conns) = self.conns.lock() {
            if conns.len() < self.max {
                conns.push((conn, Instant::now()));
            }
        }
    }

    // The most recently used connection still open and not idle too long; older ones that
    // timed out are closed on the way (dropped).
    pub(super) fn take(&self) -> Option<SendRequest<Body>> {
        let mut conns = self.conns.lock().ok()?;
        while let Some((conn, since)) = conns.pop() {
            if !conn.is_closed() && since.elapsed() < IDLE_TIMEOUT {
                return Some(conn);
            }
        }
        None
    }

    pub(super) fn close_timed_out(&self) {
        if let Ok(mut conns) = self.conns.lock() {
            conns.retain(|(conn, since)| !conn.is_closed() && since.elapsed() < IDLE_TIMEOUT);
        }
    }
}

/// A response body from the upstream; its connection goes back to the idle stack when it ends.
#[derive(Debug)]
pub(crate) struct ResponseBody {
    body: Incoming,
    conn: Option<(SendRequest<Body>, Arc<Idle>)>,
}

impl ResponseBody {
    pub(super) fn new(body: Incoming, conn: SendRequest<Body>, idle: &Arc<Idle>) -> Self {
        Self {
            body,
            conn: Some((conn, Arc::clone(idle))),
        }
    }

    fn check_in(&mut self) {
        if let Some((conn, idle)) = self.conn.take() {
            idle.put(conn);
        }
    }
}

impl Drop for ResponseBody {
    // A reader that took the message it wanted may drop the body without reading its end (the
    // SSE stream of a call after its result): the connection is kept once it is ready for the
    // next request, which it is at once when the response had arrived whole. A body cut short
    // makes hyper close its connection instead.
    fn drop(&mut self) {
        let Some((mut conn, idle)) = self.conn.take() else {
            return;
        };
        if conn.is_ready() {
            return idle.put(conn);
        }
        if conn.is_closed() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Ok(Ok(())) = tokio::time::timeout(READY_AFTER_DROP, conn.ready()).await {
                    idle.put(conn);
                }
            });
        }
    }
}

impl HttpBody for ResponseBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = ready!(Pin::new(&mut self.body).poll_frame(cx));
        // A reader may stop at the last frame without asking for the end (hyper's server does,
        // for a body of known length): the end is noticed here too.
        match &frame {
            None => self.check_in(),
            Some(Ok(_)) if self.body.is_end_stream() => self.check_in(),
            Some(_) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
