//! Metrics, exposed at `GET /metrics` in the OpenMetrics text format through `prometheus-client`
//! (strict exposition: `# TYPE`/`# HELP`/`# UNIT`, `_total`, histogram buckets, `# EOF`). Every
//! label is a bounded enum: never an id, a token, a principal or a raw path.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

mod approvals;
mod auth;
mod cluster;
mod labels;
mod series;
mod snapshot;
mod spans;
mod tasks;
mod trace_context;

pub(crate) use approvals::ApprovalMetrics;
pub(crate) use auth::AuthMetrics;
pub(crate) use cluster::ClusterMetrics;
pub(crate) use labels::{
    AcceptFailure, AuthEndpoint, AuthRefusal, Capability, Decision, Direction, Era, Forward,
    ForwardKind, Gathered, IntrospectionSkip, Limit, Method, Outcome, SpanDrop, TaskState,
    TokenRejection, TraceDrop, TraceField, UpstreamFailure,
};
use labels::{
    AcceptLabel, CapabilityLabel, DirectionLabel, GatherLabel, KindLabel, LimitLabel, ReasonLabel,
    Reload, ReloadLabel,
};
use series::Requests;
pub(crate) use snapshot::Snapshot;
pub(crate) use spans::spans_dropped;
pub(crate) use tasks::{Adopted, StoreOp, TaskMetrics};
pub(crate) use trace_context::TraceContextMetrics;

/// Every metric of the process (one instance in `App`).
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    requests: Requests,
    rounds: Counter,
    gathers: Family<GatherLabel, Counter>,
    input_requests: Counter,
    rounds_per_call: Histogram,
    park_duration: Histogram,
    resume_latency: Histogram,
    expired: Counter,
    notifications_dropped: Counter,
    token_rejections: Family<ReasonLabel, Counter>,
    capability_rejections: Family<CapabilityLabel, Counter>,
    upstream_errors: Family<KindLabel, Counter>,
    bytes_relayed: Family<DirectionLabel, Counter>,
    /// The two series of `bytes_relayed`, looked up once: counting a relayed frame is then one
    /// atomic add, not a hash of its labels under the family's lock.
    relayed_to_upstream: Counter,
    relayed_to_client: Counter,
    key_reloads: Family<ReloadLabel, Counter>,
    /// Scale-out: forwards and replays.
    pub(crate) cluster: ClusterMetrics,
    /// The approval gate's decisions.
    pub(crate) approvals: ApprovalMetrics,
    /// `[auth]`: refusals and requests to the authorization server.
    pub(crate) auth: AuthMetrics,
    /// Tasks (the tasks extension).
    pub(crate) tasks: TaskMetrics,
    /// Clients' trace context that was not sent on.
    pub(crate) trace_context: TraceContextMetrics,
    limits: Family<LimitLabel, Counter>,
    accept_errors: Family<AcceptLabel, Counter>,
    parked: Gauge,
    parked_bytes: Gauge,
    parked_limit: Gauge,
    parked_memory_limit: Gauge,
    task_bytes: Gauge,
    sessions: Gauge,
    idle_sessions: Gauge,
    legacy_sessions: Gauge,
    session_waiters: Gauge,
    listen_sessions: Gauge,
}

// 0.5 ms … ~65 s: a hop, a round, a slow tool.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 18))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every metric, registered under the `mrtr` prefix.
    pub(crate) fn new() -> Self {
        let bytes_relayed = Family::<DirectionLabel, Counter>::default();
        let series = |direction| {
            bytes_relayed
                .get_or_create(&DirectionLabel { direction })
                .clone()
        };
        let relayed_to_upstream = series(Direction::ToUpstream);
        let relayed_to_client = series(Direction::ToClient);
        let mut m = Self {
            registry: Registry::with_prefix("mrtr"),
            requests: Requests::new(latency_histogram),
            rounds: Counter::default(),
            gathers: Family::default(),
            input_requests: Counter::default(),
            rounds_per_call: Histogram::new([0.0, 1.0, 2.0, 3.0, 5.0, 10.0]),
            // 10 ms … ~5.8 h (the TTL bounds it).
            park_duration: Histogram::new(exponential_buckets(0.01, 4.0, 12)),
            resume_latency: latency_histogram(),
            expired: Counter::default(),
            notifications_dropped: Counter::default(),
            token_rejections: Family::default(),
            capability_rejections: Family::default(),
            upstream_errors: Family::default(),
            bytes_relayed,
            relayed_to_upstream,
            relayed_to_client,
            key_reloads: Family::default(),
            cluster: ClusterMetrics::default(),
            approvals: ApprovalMetrics::default(),
            auth: AuthMetrics::default(),
            tasks: TaskMetrics::default(),
            trace_context: TraceContextMetrics::default(),
            limits: Family::default(),
            accept_errors: Family::default(),
            parked: Gauge::default(),
            parked_bytes: Gauge::default(),
            parked_limit: Gauge::default(),
            parked_memory_limit: Gauge::default(),
            task_bytes: Gauge::default(),
            sessions: Gauge::default(),
            idle_sessions: Gauge::default(),
            legacy_sessions: Gauge::default(),
            session_waiters: Gauge::default(),
            listen_sessions: Gauge::default(),
        };
        m.register();
        m
    }

    fn register(&mut self) {
        let r = &mut self.registry;
        self.requests.register(r);
        r.register("rounds", "input_required results sent", self.rounds.clone());
        r.register(
            "round_gathers",
            "Rounds gathered, by whether they waited out the gather window",
            self.gathers.clone(),
        );
        r.register(
            "input_requests",
            "Input requests (keys) sent across all rounds",
            self.input_requests.clone(),
        );
        r.register(
            "rounds_per_call",
            "Rounds an input-capable call went through before it ended",
            self.rounds_per_call.clone(),
        );
        spans::register(r);
        self.register_state();
    }

    fn register_state(&mut self) {
        let r = &mut self.registry;
        r.register_with_unit(
            "park_duration",
            "Time a call stayed parked before its retry, expiry or shutdown",
            Unit::Seconds,
            self.park_duration.clone(),
        );
        r.register_with_unit(
            "resume_latency",
            "Time from a claimed retry to its answers acknowledged by the upstream",
            Unit::Seconds,
            self.resume_latency.clone(),
        );
        r.register(
            "expired_calls",
            "Parked calls ended by their TTL",
            self.expired.clone(),
        );
        r.register(
            "notifications_dropped",
            "Progress and log notifications not relayed: the client's stream was not read",
            self.notifications_dropped.clone(),
        );
        r.register(
            "token_rejections",
            "Retries refused, by reason",
            self.token_rejections.clone(),
        );
        r.register(
            "capability_rejections",
            "Calls refused with -32021, by the capability missing",
            self.capability_rejections.clone(),
        );
        r.register(
            "upstream_errors",
            "Failures talking to the upstream, by kind",
            self.upstream_errors.clone(),
        );
        r.register_with_unit(
            "relayed",
            "Body bytes relayed for legacy clients, by direction",
            Unit::Bytes,
            self.bytes_relayed.clone(),
        );
        r.register(
            "key_reloads",
            "Reloads of the requestState keys (SIGHUP), by result",
            self.key_reloads.clone(),
        );
        self.cluster.register(&mut self.registry);
        self.approvals.register(&mut self.registry);
        self.auth.register(&mut self.registry);
        self.tasks.register(&mut self.registry);
        self.trace_context.register(&mut self.registry);
        self.register_gauges();
    }

    fn register_gauges(&mut self) {
        let r = &mut self.registry;
        r.register(
            "limit_hits",
            "Requests refused or connections shed by a bound, by bound",
            self.limits.clone(),
        );
        r.register(
            "accept_errors",
            "Failed accepts of a client connection, by kind",
            self.accept_errors.clone(),
        );
        r.register("parked_calls", "Calls parked now", self.parked.clone());
        r.register(
            "parked_calls_limit",
            "state.max_parked as in force (sized from memory and open files when not set)",
            self.parked_limit.clone(),
        );
        r.register_with_unit(
            "parked_memory_limit",
            "state.max_parked_memory",
            Unit::Bytes,
            self.parked_memory_limit.clone(),
        );
        r.register_with_unit(
            "parked_memory",
            "Memory charged to parked calls now (their params plus a fixed overhead each)",
            Unit::Bytes,
            self.parked_bytes.clone(),
        );
        r.register_with_unit(
            "task_memory",
            "Memory charged to tasks now (params, results and a fixed overhead each)",
            Unit::Bytes,
            self.task_bytes.clone(),
        );
        r.register(
            "upstream_sessions",
            "Upstream sessions open now (leased and idle)",
            self.sessions.clone(),
        );
        r.register(
            "idle_sessions",
            "Idle upstream sessions now",
            self.idle_sessions.clone(),
        );
        let legacy = "Legacy clients' sessions the proxy serves itself now";
        r.register("legacy_sessions", legacy, self.legacy_sessions.clone());
        r.register(
            "session_waiters",
            "Requests waiting for an upstream session now (pool full)",
            self.session_waiters.clone(),
        );
        r.register(
            "listen_sessions",
            "Upstream sessions listen streams pin now",
            self.listen_sessions.clone(),
        );
    }

    /// A bound refused a request or shed a connection.
    pub(crate) fn limit_hit(&self, limit: Limit) {
        self.limits.get_or_create(&LimitLabel { limit }).inc();
    }

    /// Accepting a client connection failed.
    pub(crate) fn accept_failed(&self, kind: AcceptFailure) {
        self.accept_errors
            .get_or_create(&AcceptLabel { kind })
            .inc();
    }

    /// A key reload ended (`ok` or not).
    pub(crate) fn key_reload(&self, ok: bool) {
        let result = if ok { Reload::Ok } else { Reload::Error };
        self.key_reloads
            .get_or_create(&ReloadLabel { result })
            .inc();
    }

    /// A request ended with `outcome` after `elapsed`.
    pub(crate) fn request(&self, era: Era, method: Method, outcome: Outcome, elapsed: Duration) {
        self.requests.count(era, method, outcome, elapsed);
    }

    /// An `input_required` round with `keys` input requests was sent.
    pub(crate) fn round_sent(&self, keys: usize) {
        self.rounds.inc();
        self.input_requests.inc_by(keys as u64);
    }

    /// A round's gather ended, after the window or with only what had arrived.
    pub(crate) fn gathered(&self, wait: Gathered) {
        self.gathers.get_or_create(&GatherLabel { wait }).inc();
    }

    /// An input-capable call ended after `rounds` rounds.
    pub(crate) fn call_ended(&self, rounds: u32) {
        self.rounds_per_call.observe(f64::from(rounds));
    }

    /// A call left the parked phase after `parked`.
    pub(crate) fn unparked(&self, parked: Duration) {
        self.park_duration.observe(parked.as_secs_f64());
    }

    /// A retry's answers reached the upstream `elapsed` after the retry was claimed.
    pub(crate) fn resumed(&self, elapsed: Duration) {
        self.resume_latency.observe(elapsed.as_secs_f64());
    }

    /// A parked call reached its deadline.
    pub(crate) fn call_expired(&self) {
        self.expired.inc();
    }

    /// A progress or log notification was dropped: the client did not read its stream.
    pub(crate) fn notification_dropped(&self) {
        self.notifications_dropped.inc();
    }

    /// A retry was refused for `reason`.
    pub(crate) fn token_rejected(&self, reason: TokenRejection) {
        self.token_rejections
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// A call was refused with -32021 for lack of `capability`.
    pub(crate) fn capability_rejected(&self, capability: Capability) {
        self.capability_rejections
            .get_or_create(&CapabilityLabel { capability })
            .inc();
    }

    /// Talking to the upstream failed with `kind`.
    pub(crate) fn upstream_failed(&self, kind: UpstreamFailure) {
        self.upstream_errors
            .get_or_create(&KindLabel { kind })
            .inc();
    }

    /// `n` body bytes were relayed for a legacy client.
    pub(crate) fn relayed(&self, direction: Direction, n: usize) {
        let series = match direction {
            Direction::ToUpstream => &self.relayed_to_upstream,
            Direction::ToClient => &self.relayed_to_client,
        };
        series.inc_by(n as u64);
    }

    /// The parked-call bounds in force (what alerts compare `mrtr_parked_calls` with).
    pub(crate) fn parked_bounds(&self, calls: usize, bytes: usize) {
        let set = |g: &Gauge, v: usize| g.set(i64::try_from(v).unwrap_or(i64::MAX));
        set(&self.parked_limit, calls);
        set(&self.parked_memory_limit, bytes);
    }

    /// The exposition, with gauges set from `now`.
    pub(crate) fn render(&self, now: Snapshot) -> String {
        let set = |g: &Gauge, v: usize| g.set(i64::try_from(v).unwrap_or(i64::MAX));
        set(&self.parked, now.parked);
        set(&self.parked_bytes, now.parked_bytes);
        set(&self.task_bytes, now.task_bytes);
        set(&self.sessions, now.sessions);
        set(&self.idle_sessions, now.idle_sessions);
        set(&self.session_waiters, now.session_waiters);
        set(&self.legacy_sessions, now.legacy_sessions);
        set(&self.listen_sessions, now.listen_sessions);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Times one request and records it once: when it ends, or as `cancelled` when dropped first
/// (the client went away and hyper dropped the request's future).
#[derive(Debug)]
pub(crate) struct RequestTimer {
    metrics: Arc<Metrics>,
    era: Era,
    method: Method,
    start: Instant,
    recorded: bool,
}

impl RequestTimer {
    /// Starts timing a request (a modern one of unknown method until told otherwise).
    pub(crate) fn start(metrics: &Arc<Metrics>) -> Self {
        Self {
            metrics: Arc::clone(metrics),
            era: Era::Modern,
            method: Method::Other,
            start: Instant::now(),
            recorded: false,
        }
    }

    /// Names the request once its era and method are known.
    pub(crate) fn label(&mut self, era: Era, method: Method) {
        self.era = era;
        self.method = method;
    }

    /// The metrics the request is recorded in.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Records the request's end; returns how long it took.
    pub(crate) fn finish(
        mut self,
        outcome: Outcome,
        upstream: Option<UpstreamFailure>,
    ) -> Duration {
        self.recorded = true;
        let elapsed = self.start.elapsed();
        self.metrics
            .request(self.era, self.method, outcome, elapsed);
        if let Some(kind) = upstream {
            self.metrics.upstream_failed(kind);
        }
        elapsed
    }
}

impl Drop for RequestTimer {
    fn drop(&mut self) {
        if !self.recorded {
            let elapsed = self.start.elapsed();
            self.metrics
                .request(self.era, self.method, Outcome::Cancelled, elapsed);
        }
    }
}

#[cfg(test)]
mod tests;
