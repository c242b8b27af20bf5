//! The call actor: one task per forwarded modern request. It owns the leased upstream session,
//! the upstream request and its response stream, relays request-scoped notifications, and — for
//! `tools/call`, `prompts/get`, `resources/read` — parks the live upstream call when the server
//! asks for input, answering `input_required` with a signed requestState, then resumes it when
//! the client retries. Its state is one [`Phase`], moved only by the transitions of `phase`
//! (named on the arrows):
//!
//! ```text
//!                 server request: gather              window over: park
//!   Running(leg) ─────────────────────▶ Gathering(leg) ─────────────▶ Parked ◀──┐ keys missing:
//!     │  ▲  └── -32042 (URL elicitations): park ───────────────────────▲  │     │ park (round n+1)
//!     │  │                                                             │  │ retry claimed: resume
//!     │  └───── every key answered: run ◀── Resuming(leg) ◀────────────┼──┘     │
//!     │                                       └────────────────────────┼────────┘
//!   final result (or error): finish ─▶ Done    Parked ── deadline: cancel upstream, finish ─▶ Done
//!   any phase ── client gone / upstream failure / shutdown: finish ─▶ Done
//!   Running ── `tasks.after` passed (the client declared the tasks extension): detach ─▶ Detached
//!   Detached ── final result, failure, tasks/cancel, the task's TTL, shutdown: finish ─▶ Done
//!   (a replay-safe task adopted from a lost instance): adopted ─▶ Detached
//! ```
//!
//! A leg is one client exchange (the first request or a retry); `Parked` is the only phase with
//! none open. A server request that comes while parked joins the next round; a final result that
//! comes while parked is held (`hold`) for the next retry. `finish` hands back the open leg for
//! the call's last word; on every way to `Done` the registry entry is retired and the lease
//! released (closed, not reused, if the upstream call may still run).
//! This file runs the call; `phase` is where it is, `send` sends it upstream on a leased session,
//! `notify` relays what the upstream notifies, `park` turns server requests into rounds and takes
//! retries, `gather` learns how long a round waits, `rounds` keeps the pending server requests
//! (pure), `replaying` runs its replay and `replay_state` keeps it (pure), `registry` the parked
//! calls, `leg` the client exchange, `end` every way a call ends, `task` the call as a task of the
//! tasks extension, `legacy_task` a tool the upstream runs only as its own (2025-11-25) task.

use std::future::{Future, Pending};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::Either;
use futures_util::StreamExt;
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::config;
use crate::jsonrpc::{Kind, Message};
use crate::ops::metrics::{Gathered, Metrics};
use crate::state::replay::Replayer;
use crate::state::TokenCodec;
use crate::tasks::{Control, Tasks};
use crate::upstream::{
    Credentials, Declared, Lease, ResponseStream, Session, SessionPool, UpstreamError,
};

mod end;
mod gather;
mod leg;
mod legacy_task;
mod notify;
mod park;
mod phase;
mod registry;
mod replay_state;
mod replaying;
mod rounds;
mod send;
mod task;

pub(crate) use gather::Gather;
pub(crate) use leg::{Leg, LegEvent, Outcome};
use phase::Phase;
use registry::ParkGuard;
pub(crate) use registry::{ParkedCalls, Retry, RetrySender};
use replay_state::ReplayState;
use rounds::Rounds;

/// What every call actor shares.
#[derive(Debug)]
pub(crate) struct CallContext {
    /// Upstream sessions.
    pub(crate) pool: Arc<SessionPool>,
    /// Parked calls, for retries to find.
    pub(crate) parked: Arc<ParkedCalls>,
    /// requestState signer (the one the app holds).
    pub(crate) tokens: Arc<TokenCodec>,
    /// Counters.
    pub(crate) metrics: Arc<Metrics>,
    /// Turns `true` when the drain is over: open calls cancel upstream.
    pub(crate) shutdown: watch::Receiver<bool>,
    /// Every call actor, so that shutdown can wait for their upstream cancellations.
    pub(crate) actors: TaskTracker,
    /// The tasks of this instance (calls that became tasks of the tasks extension).
    pub(crate) tasks: Arc<Tasks>,
    /// How long server requests are gathered into one round, per target as learned.
    pub(crate) gather: gather::Gather,
    /// A running call's upstream response may stay silent (no bytes at all) this long.
    pub(crate) sse_idle_timeout: Duration,
    /// Server requests one call may have pending at once.
    pub(crate) max_input_requests: usize,
    /// The cache hints for cacheable results (calls that had no round).
    pub(crate) results: config::Results,
    /// Which calls are replay-safe, and how large a journal a token carries.
    pub(crate) replay: config::Replay,
    /// The upstream's tool annotations, for `replay = "annotations"`.
    pub(crate) tool_hints: crate::state::replay::ToolHints,
}

/// What the front asks the actor to run.
#[derive(Debug)]
pub(crate) struct CallSpec {
    /// Method name.
    pub(crate) method: String,
    /// Params sent upstream (modern-only fields removed), as JSON text: kept for a re-send
    /// after -32042, and a parked call holds text, not a tree several times its size.
    pub(crate) upstream_params: Option<Box<str>>,
    /// Declared client capabilities (shared with the front's memo of them).
    pub(crate) capabilities: Arc<Value>,
    /// What the session serving it declares upstream (the pool's key).
    pub(crate) declared: Declared,
    /// May park (`tools/call`, `prompts/get`, `resources/read`).
    pub(crate) input_capable: bool,
    /// Principal digest.
    pub(crate) principal: String,
    /// What goes upstream for the principal: the latest leg's (a retry brings its own).
    pub(crate) credentials: Credentials,
    /// With traces exported: the first leg's span as a `traceparent`, carried in the tokens
    /// (taken at the first round: a call that never parks never needs it).
    pub(crate) origin: Option<String>,
    /// With traces exported: the client span of the upstream call (ends with the actor); the
    /// task's transitions are its events.
    pub(crate) upstream_span: tracing::Span,
    /// Request digest (method + target + arguments), worked out at the first round (see
    /// [`CallSpec::request_digest`]).
    pub(crate) request_digest: OnceLock<String>,
    /// Tool or prompt name, or resource URI (picks the replay mode).
    pub(crate) target: String,
    /// Set when the call runs again because the instance that held it is gone: the answers
    /// its token carried, for the requests the upstream asks again. The actor moves it into
    /// its replay state as it starts.
    pub(crate) replay_from: Option<Replayer>,
    /// A call of a tool `[approval]` gates: never replay-safe, whatever `[replay]` says.
    pub(crate) gated: bool,
    /// How long the call may run (without finishing or asking for input) before it becomes a
    /// task; `None`: never (the client did not declare the extension, or `[tasks]` says so).
    pub(crate) task_after: Option<Duration>,
}

/// Starts the actor for a fresh call; `first` is the client's exchange.
pub(crate) fn spawn(ctx: Arc<CallContext>, spec: CallSpec, first: Leg) {
    launch(ctx, spec, Phase::start(first), Rounds::default());
}

/// Starts the actor of a replay-safe task adopted from an instance that was lost: it runs the
/// call again as that task from the start (no exchange is open), answering from the task's
/// journal what was answered before, listing on the task what is asked anew.
pub(crate) fn spawn_adopted(ctx: Arc<CallContext>, spec: CallSpec, adopted: AdoptedTask) {
    let task = TaskRun {
        guard: adopted.guard,
        control: adopted.mailbox,
        replay_safe: true,
    };
    let rounds = Rounds::after(adopted.keys_minted);
    launch(ctx, spec, Phase::adopted(task), rounds);
}

/// An adopted task's part of [`spawn_adopted`].
pub(crate) struct AdoptedTask {
    /// The task's guard and mailbox.
    pub(crate) guard: crate::tasks::TaskGuard,
    /// See `guard`.
    pub(crate) mailbox: mpsc::Receiver<Control>,
    /// Keys minted over the task's life.
    pub(crate) keys_minted: u32,
}

fn launch(ctx: Arc<CallContext>, mut spec: CallSpec, phase: Phase<TaskRun>, rounds: Rounds) {
    let (inbox_tx, inbox_rx) = futures_channel::mpsc::unbounded();
    let replay = ReplayState::new(spec.replay_from.take());
    let call = Call {
        ctx,
        spec,
        phase,
        rounds,
        replay,
        parking: None,
        lease: None,
        upstream: Upstream::Idle,
        upstream_status: None,
        early_inbox: None,
        legacy_task: None,
        leg_opened: Instant::now(),
        inbox_tx,
        inbox_rx,
    };
    // Boxed: spawning moves a future by value through the task's setup more than once; a box
    // moves as one pointer. The call too: an `async fn` keeps a by-value `self` twice.
    let actors = call.ctx.actors.clone();
    actors.spawn(Box::pin(Box::new(call).run()));
}

impl CallSpec {
    /// The digest of the request (method + target + arguments) the call's tokens bind, worked
    /// out the first time it is asked for: a call that never parks never needs it, nor its
    /// arguments as a tree.
    pub(crate) fn request_digest(&self) -> &str {
        #[derive(serde::Deserialize)]
        struct Arguments {
            #[serde(default)]
            arguments: Value,
        }
        self.request_digest.get_or_init(|| {
            let arguments = self
                .upstream_params
                .as_ref()
                .and_then(|p| serde_json::from_str::<Arguments>(p).ok())
                .map_or(Value::Null, |a| a.arguments);
            crate::state::request_digest(&self.method, &self.target, &arguments)
        })
    }

    /// What this call's gather habit is learned under.
    fn gather_key(&self) -> u64 {
        gather::key(&self.method, &self.target, &self.capabilities)
    }
}

impl CallContext {
    /// Resolves once no call actor runs (after the tracker was closed by the drain).
    pub(crate) async fn wait_idle(&self) {
        self.actors.wait().await;
    }

    /// Call actors running now (parked ones included).
    pub(crate) fn open(&self) -> usize {
        self.actors.len()
    }
}

/// The upstream request of the call.
#[expect(
    clippy::large_enum_variant,
    reason = "one per call, inside the actor's own task: boxing would only add an allocation"
)]
enum Upstream {
    /// Nothing in flight: not sent yet, or answered.
    Idle,
    /// Request `id` was sent; its response (or the wait for its headers).
    InFlight { id: i64, stream: ResponseStream },
}

/// The task the call became (see `task`): what `Phase::Detached` runs with.
#[derive(Debug)]
struct TaskRun {
    guard: crate::tasks::TaskGuard,
    control: mpsc::Receiver<Control>,
    /// Its record keeps a journal of the answers (another instance may run it again).
    replay_safe: bool,
}

/// The upstream's own (2025-11-25) task a call waits on (see `legacy_task`).
#[derive(Debug)]
struct LegacyTask {
    /// Its id, upstream.
    id: String,
    /// The `tasks/result` request's params (the task lives on the session that created it).
    result_params: Box<RawValue>,
}

/// The call's entry in the registry, from its first round to its end.
struct Parking {
    guard: ParkGuard,
    retries: futures_channel::mpsc::UnboundedReceiver<Box<Retry>>,
}

// Field order is drop order: the registry entry goes before the lease closes the session, so a
// client that sees the session end also sees the entry gone.
struct Call {
    ctx: Arc<CallContext>,
    spec: CallSpec,
    phase: Phase<TaskRun>,
    rounds: Rounds,
    replay: ReplayState,
    parking: Option<Parking>,
    lease: Option<Lease>,
    upstream: Upstream,
    /// HTTP status of the upstream response that carried the final message (for the span).
    upstream_status: Option<u16>,
    /// A GET-stream server request that arrived while the call waited for its response headers.
    early_inbox: Option<Bytes>,
    /// The upstream's own (2025-11-25) task the call waits on, for a tool that runs only as one.
    legacy_task: Option<LegacyTask>,
    /// When the open exchange began (the first request, or the retry that resumed the call):
    /// the call becomes a task `task_after` later.
    leg_opened: Instant,
    inbox_tx: futures_channel::mpsc::UnboundedSender<Bytes>,
    inbox_rx: futures_channel::mpsc::UnboundedReceiver<Bytes>,
}

enum Event {
    Upstream(Option<Result<Bytes, UpstreamError>>),
    Inbox(Bytes),
    ClientGone,
    GatherOver,
    Retry(Option<Box<Retry>>),
    Expired,
    /// The call has run `task_after` on its exchange: it becomes a task.
    TaskDue,
    /// The client answered or cancelled the task.
    Task(Option<Control>),
    /// The task's TTL ran out.
    TaskExpired,
    /// The upstream response of a running call may have been silent too long (checked again
    /// when handled: bytes may have come meanwhile).
    UpstreamQuiet,
    Shutdown,
}

impl Call {
    // The steps are boxed as they run: inline, the largest of them (an event's handling) would
    // size the whole future, which every parked call holds while it waits; boxed, a step's box
    // lives only while the step runs (`docs/BENCHMARKS.md` has the sizes).
    async fn run(mut self: Box<Self>) {
        if let Err(e) = Box::pin(self.send_request()).await {
            Box::pin(self.fail(e)).await;
        }
        while !self.phase.is_done() {
            let event = self.next_event().await;
            let parked_since = self.phase.parked_since();
            self.on_event(event).await;
            if let Some(since) = parked_since.filter(|_| self.phase.parked_since().is_none()) {
                self.ctx.metrics.unparked(since.elapsed());
            }
        }
        if self.spec.input_capable {
            self.ctx.metrics.call_ended(self.rounds.opened());
        }
        Box::pin(self.turn_away_queued_retries()).await;
    }

    // Each arm is boxed as it runs: an event's future is the size of its own work, not of the
    // largest arm's (moving ~5 KiB per event was a tenth of a plain call's instructions).
    async fn on_event(&mut self, event: Event) {
        match event {
            Event::Upstream(Some(Ok(bytes))) => Box::pin(self.on_upstream(bytes)).await,
            Event::Upstream(end) => {
                self.upstream = Upstream::Idle;
                let err = match end {
                    Some(Err(e)) => e,
                    _ => UpstreamError::Closed,
                };
                Box::pin(self.fail(err.into())).await;
            }
            Event::Inbox(bytes) => match Message::parse(&bytes) {
                Ok(msg) if msg.id.is_none() => Box::pin(self.on_notification(&msg)).await,
                Ok(msg) => Box::pin(self.on_server_request(msg)).await,
                Err(_) => tracing::debug!("ignoring a malformed upstream request"),
            },
            Event::ClientGone => {
                Box::pin(self.cancel_upstream("the client closed the request")).await;
                // Its exchange goes with it: there is no one to tell.
                self.phase.finish();
            }
            Event::GatherOver => Box::pin(self.end_gather()).await,
            Event::Retry(Some(retry)) => Box::pin(self.on_retry(retry)).await,
            Event::Retry(None) => {
                self.phase.finish();
            }
            Event::Expired => Box::pin(self.expire()).await,
            Event::TaskDue => Box::pin(self.become_task()).await,
            Event::Task(control) => Box::pin(self.on_control(control)).await,
            Event::TaskExpired => Box::pin(self.expire_task()).await,
            Event::UpstreamQuiet => Box::pin(self.on_quiet_upstream()).await,
            Event::Shutdown => Box::pin(self.shut_down()).await,
        }
    }

    // The round is gathered: learn from it, and answer it.
    async fn end_gather(&mut self) {
        let waited = matches!(self.phase.gathering(), Some(Some(_)));
        if waited && self.rounds.pending() == 1 {
            self.ctx.gather.saw_one(self.spec.gather_key());
        }
        let wait = if waited {
            Gathered::Window
        } else {
            Gathered::Arrived
        };
        self.ctx.metrics.gathered(wait);
        self.park().await;
    }

    async fn next_event(&mut self) -> Event {
        if let Some(b) = self.early_inbox.take() {
            return Event::Inbox(b);
        }
        let task_due = self.task_due();
        let Self {
            ctx,
            phase,
            parking,
            upstream,
            inbox_rx,
            ..
        } = self;
        let mut shutdown = ctx.shutdown.clone();
        let (gather, deadline) = (phase.gathering(), phase.deadline());
        let task_deadline = phase.task().map(|t| t.guard.deadline());
        let retries = parking.as_mut().filter(|_| deadline.is_some());
        let stream = match upstream {
            Upstream::InFlight { stream, .. } => Some(stream),
            Upstream::Idle => None,
        };
        // Silence is bounded only while a client waits on the upstream: parked, the TTL bounds
        // it; gathering, the window does.
        let quiet = stream
            .as_ref()
            .filter(|_| phase.awaits_upstream())
            .and_then(|s| s.last_activity())
            .map(|t| t + ctx.sse_idle_timeout);
        let (leg, task) = phase.waits_on();
        let task_control = task.map(|t| t.control.recv());
        // Biased: a retry already claimed (its token checked) is served before a deadline that
        // fires in the same instant.
        tokio::select! {
            biased;
            r = or_pending(retries.map(|p| p.retries.next())) => Event::Retry(r),
            m = or_pending(stream.map(ResponseStream::next)) => Event::Upstream(m),
            Some(b) = inbox_rx.next() => Event::Inbox(b),
            () = or_pending(leg.map(Leg::closed)) => Event::ClientGone,
            () = or_pending(gather.map(gather_over)) => Event::GatherOver,
            () = or_pending(deadline.map(tokio::time::sleep_until)) => Event::Expired,
            c = or_pending(task_control) => Event::Task(c),
            () = or_pending(task_due.map(tokio::time::sleep_until)) => Event::TaskDue,
            () = or_pending(task_deadline.map(tokio::time::sleep_until)) => Event::TaskExpired,
            () = or_pending(quiet.map(tokio::time::sleep_until)) => Event::UpstreamQuiet,
            _ = shutdown.wait_for(|down| *down) => Event::Shutdown,
        }
    }

    async fn on_upstream(&mut self, bytes: Bytes) {
        let Ok(msg) = Message::parse(&bytes) else {
            tracing::debug!("ignoring a malformed upstream message");
            return;
        };
        match msg.kind() {
            Ok(Kind::Response) if self.answers_our_request(&msg) => {
                if let Upstream::InFlight { stream, .. } = &self.upstream {
                    self.upstream_status = stream.status().map(|s| s.as_u16());
                }
                self.upstream = Upstream::Idle;
                self.on_final(msg).await;
            }
            // Boxed: a round's path, kept out of the final answer's future.
            Ok(Kind::Request) => Box::pin(self.on_server_request(msg)).await,
            Ok(Kind::Notification) => {
                if let Some(lease) = &self.lease {
                    lease.session().publish_change(msg.method(), &bytes);
                }
                self.on_notification(&msg).await;
            }
            _ => {}
        }
    }

    fn answers_our_request(&self, msg: &Message) -> bool {
        match (&self.upstream, &msg.id) {
            (Upstream::InFlight { id, .. }, Some(raw)) => crate::jsonrpc::id_is(raw, *id),
            _ => false,
        }
    }

    // The upstream's `serverInfo`, as the session keeps it (text).
    fn server_info(&self) -> Option<&RawValue> {
        self.lease.as_ref()?.session().server_info()
    }

    fn session(&self) -> Option<Arc<Session>> {
        self.lease.as_ref().map(|l| Arc::clone(l.session()))
    }
}

// The end of a gather: the window, or (with none) one yield, so that what the connection tasks
// already read reaches the stream before the round is answered (the select is biased towards it).
async fn gather_over(until: Option<Instant>) {
    match until {
        Some(t) => tokio::time::sleep_until(t).await,
        None => tokio::task::yield_now().await,
    }
}

// A future that never resolves when there is nothing to wait for. Not an `async fn`: that
// would hold `f` twice (as passed and as awaited), and a parked call's wait holds ten of them.
pub(super) fn or_pending<F: Future>(f: Option<F>) -> Either<F, Pending<F::Output>> {
    match f {
        Some(f) => Either::Left(f),
        None => Either::Right(std::future::pending()),
    }
}
