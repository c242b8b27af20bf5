//! A session carried on one message stream each way: a stdio child (stdin / stdout) or an HTTP+SSE
//! session (POSTs to the announced endpoint / the one `GET /sse` stream).
//!
//! Every upstream message arrives on the one reader, so this is where they are told apart: an
//! answer goes to the request with its id; a progress notification to the request whose
//! `progressToken` it names; any other server request or notification to the oldest request
//! still open (the call holding the session's lease: these transports link nothing to the
//! request that caused it, which is why a session runs one input-capable call at a time), and
//! with no request open to the session's defaults, as a Streamable HTTP GET stream's would.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::client::UpstreamError;
use crate::jsonrpc::{Kind, Message};

/// Messages of one request read but not yet taken by its call, before the reader waits.
const ROUTE_BACKLOG: usize = 64;

/// A boxed future of a sink (the sinks are few and their messages rare next to an HTTP hop).
pub(crate) type SinkFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where a link's outgoing messages go: a child's stdin, or POSTs to an HTTP+SSE endpoint.
pub(crate) trait Sink: Send + Sync + std::fmt::Debug {
    /// Sends one message.
    fn send(&self, message: Vec<u8>) -> SinkFuture<'_, Result<(), UpstreamError>>;
    /// Stops the transport for good (a child is stopped and reaped).
    fn stop(&self) -> SinkFuture<'_, ()>;
}

/// Who takes what no open request does, and learns that the link is gone: the session.
pub(crate) trait Owner: Send + Sync {
    /// A server request or notification with no open request to go to (a default answer is
    /// written before the reader goes on, bounded by the sink's write timeout).
    fn unrouted(self: Arc<Self>, message: Bytes) -> SinkFuture<'static, ()>;
    /// The link closed.
    fn closed(&self);
}

/// One stream-carried session's plumbing (see the module docs).
#[derive(Debug)]
pub(crate) struct Link {
    sink: Box<dyn Sink>,
    /// Open requests by id: where their messages go.
    routes: Mutex<BTreeMap<i64, mpsc::Sender<Bytes>>>,
    /// The `progressToken` of open requests that set one (its JSON text) → their id: progress
    /// goes to its request's stream, whichever request is oldest.
    progress: Mutex<HashMap<String, i64>>,
    owner: OnceLock<Weak<dyn Owner>>,
    /// When the reader last got bytes (messages and keep-alives alike).
    last_read: Mutex<Instant>,
    closed: AtomicBool,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// What a request's stream reads: its messages, and the link's clock of last activity.
#[derive(Debug)]
pub(crate) struct Routed {
    pub(crate) rx: mpsc::Receiver<Bytes>,
    pub(crate) link: Arc<Link>,
}

impl Link {
    /// A link writing to `sink`; its readers are added with [`Link::track`].
    pub(crate) fn new(sink: Box<dyn Sink>) -> Arc<Self> {
        Arc::new(Self {
            sink,
            routes: Mutex::new(BTreeMap::new()),
            progress: Mutex::new(HashMap::new()),
            owner: OnceLock::new(),
            last_read: Mutex::new(Instant::now()),
            closed: AtomicBool::new(false),
            tasks: Mutex::new(Vec::new()),
        })
    }

    /// Keeps a reader task, aborted when the link closes.
    pub(crate) fn track(&self, task: JoinHandle<()>) {
        if let Ok(mut tasks) = self.tasks.lock() {
            tasks.push(task);
        }
    }

    /// Names the session this link carries (after its handshake), for messages no request takes.
    pub(crate) fn attach(&self, owner: Weak<dyn Owner>) {
        let _ = self.owner.set(owner);
    }

    fn owner(&self) -> Option<Arc<dyn Owner>> {
        self.owner.get().and_then(Weak::upgrade)
    }

    /// True once the reader ended or the link was closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// When the upstream last sent anything.
    pub(crate) fn last_read(&self) -> Instant {
        self.last_read
            .lock()
            .map(|t| *t)
            .unwrap_or_else(|_| Instant::now())
    }

    /// Records that the reader got bytes.
    pub(crate) fn touch(&self) {
        if let Ok(mut t) = self.last_read.lock() {
            *t = Instant::now();
        }
    }

    /// Sends one message.
    ///
    /// # Errors
    /// [`UpstreamError::Closed`] once the link is closed; the sink's write errors.
    pub(crate) async fn send(&self, message: Vec<u8>) -> Result<(), UpstreamError> {
        if self.is_closed() {
            return Err(UpstreamError::Closed);
        }
        let sent = self.sink.send(message).await;
        if let Err(e) = &sent {
            tracing::debug!(error = %e, "upstream write failed; closing the session");
            self.on_closed();
        }
        sent
    }

    /// Sends request `id` and routes its messages (up to and including its answer) to the
    /// returned stream.
    ///
    /// # Errors
    /// As [`Link::send`].
    pub(crate) async fn request(
        self: &Arc<Self>,
        id: i64,
        message: Vec<u8>,
    ) -> Result<Routed, UpstreamError> {
        let (tx, rx) = mpsc::channel(ROUTE_BACKLOG);
        if let Ok(mut routes) = self.routes.lock() {
            routes.insert(id, tx);
        }
        if let Some(token) = progress_token(&message) {
            if let Ok(mut progress) = self.progress.lock() {
                progress.insert(token, id);
            }
        }
        if let Err(e) = self.send(message).await {
            self.unroute(id);
            return Err(e);
        }
        // Closed while sending: the reader's clean-up may have run before the route existed.
        if self.is_closed() {
            self.unroute(id);
        }
        Ok(Routed {
            rx,
            link: Arc::clone(self),
        })
    }

    fn unroute(&self, id: i64) {
        if let Ok(mut routes) = self.routes.lock() {
            routes.remove(&id);
        }
        self.forget_progress(id);
    }

    fn forget_progress(&self, id: i64) {
        if let Ok(mut progress) = self.progress.lock() {
            progress.retain(|_, r| *r != id);
        }
    }

    /// Hands one message from the reader to whoever it belongs to (see the module docs). Waits
    /// while that request's stream is full: the reader slows down as an HTTP body would, instead
    /// of queueing without bound.
    pub(crate) async fn dispatch(&self, bytes: Bytes) {
        let Ok(msg) = Message::parse(&bytes) else {
            tracing::debug!("ignoring a malformed upstream message");
            return;
        };
        match msg.kind() {
            Ok(Kind::Response) => {
                let id = msg
                    .id
                    .as_ref()
                    .and_then(|r| r.get().trim().parse::<i64>().ok());
                let route = id.and_then(|id| self.routes.lock().ok()?.remove(&id));
                if let Some(id) = id {
                    self.forget_progress(id);
                }
                if let Some(tx) = route {
                    let _ = tx.send(bytes).await;
                }
            }
            Ok(Kind::Notification) if msg.method() == "notifications/progress" => {
                if let Some(tx) = self.progress_route(&msg) {
                    if tx.send(bytes.clone()).await.is_ok() {
                        return;
                    }
                }
                self.to_oldest(bytes).await;
            }
            Ok(Kind::Request | Kind::Notification) => self.to_oldest(bytes).await,
            Err(_) => {}
        }
    }

    // The stream of the open request whose progress token `msg` (a progress notification) names.
    fn progress_route(&self, msg: &Message) -> Option<mpsc::Sender<Bytes>> {
        let params: serde_json::Value = serde_json::from_str(msg.params.as_ref()?.get()).ok()?;
        let token = serde_json::to_string(params.get("progressToken")?).ok()?;
        let id = *self.progress.lock().ok()?.get(&token)?;
        self.routes.lock().ok()?.get(&id).cloned()
    }

    // A server request or notification: to the oldest open request, else to the owner.
    async fn to_oldest(&self, bytes: Bytes) {
        // The oldest open request whose reader is still there.
        while let Some((id, tx)) = self.oldest_route() {
            if tx.send(bytes.clone()).await.is_ok() {
                return;
            }
            self.unroute(id);
        }
        if let Some(owner) = self.owner() {
            owner.unrouted(bytes).await;
        }
    }

    fn oldest_route(&self) -> Option<(i64, mpsc::Sender<Bytes>)> {
        let routes = self.routes.lock().ok()?;
        routes.first_key_value().map(|(id, tx)| (*id, tx.clone()))
    }

    /// The reader ended (the child exited, the GET stream closed) or a write failed: the
    /// session is dead and every open request's stream ends, so its call fails as upstream-gone.
    pub(crate) fn on_closed(&self) {
        self.closed.store(true, Ordering::Release);
        if let Ok(mut routes) = self.routes.lock() {
            routes.clear();
        }
        if let Ok(mut progress) = self.progress.lock() {
            progress.clear();
        }
        if let Some(owner) = self.owner() {
            owner.closed();
        }
    }

    /// Ends the link: stops the readers and the transport (the child is stopped and reaped;
    /// the GET stream is dropped).
    pub(crate) async fn close(&self) {
        self.on_closed();
        // The transport first: a child still says what it has to on its way out (a cancelled
        // tool's last words on stderr) while its readers run.
        self.sink.stop().await;
        let tasks = self
            .tasks
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default();
        for t in tasks {
            t.abort();
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Ok(tasks) = self.tasks.get_mut() {
            for t in tasks.drain(..) {
                t.abort();
            }
        }
    }
}

// The `progressToken` a request sets (its JSON text), read only when the bytes name one.
fn progress_token(message: &[u8]) -> Option<String> {
    const KEY: &[u8] = b"progressToken";
    if !message.windows(KEY.len()).any(|w| w == KEY) {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(message).ok()?;
    serde_json::to_string(v.get("params")?.get("_meta")?.get("progressToken")?).ok()
}
