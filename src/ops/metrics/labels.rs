//! The labels of the metrics: each value an enum of fixed strings, so that no label can ever
//! carry an id, a token, a principal or a path; and the label sets the families are keyed by.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

// A bounded label: an enum whose every value is a fixed string.
/// A label value's place in its list: series of a family can then be kept in an array.
pub(super) trait Dense: Copy {
    /// How many values the label has.
    const COUNT: usize;
    /// This value's place, below [`Self::COUNT`].
    fn index(self) -> usize;
}

macro_rules! label_values {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident => $label:literal,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
        pub(crate) enum $name { $($(#[$vm])* $variant,)* }

        impl $name {
            /// The label value.
            pub(crate) fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $label,)* }
            }
        }

        impl Dense for $name {
            const COUNT: usize = [$(stringify!($variant)),*].len();
            fn index(self) -> usize {
                self as usize
            }
        }

        impl EncodeLabelValue for $name {
            fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
                std::fmt::Write::write_str(encoder, self.as_str())
            }
        }
    };
}

label_values! {
    /// Which side of the proxy a request came in on.
    Era {
        /// A 2026-07-28 client.
        Modern => "modern",
        /// A legacy client, relayed.
        Legacy => "legacy",
    }
}

label_values! {
    /// The method of a request, from a fixed list.
    Method {
        Discover => "server/discover",
        Listen => "subscriptions/listen",
        ToolsCall => "tools/call",
        PromptsGet => "prompts/get",
        ResourcesRead => "resources/read",
        ToolsList => "tools/list",
        PromptsList => "prompts/list",
        ResourcesList => "resources/list",
        ResourceTemplatesList => "resources/templates/list",
        Complete => "completion/complete",
        TasksGet => "tasks/get",
        TasksUpdate => "tasks/update",
        TasksCancel => "tasks/cancel",
        /// Any other method (unknown, removed) and requests that never parsed.
        Other => "other",
        /// A legacy client's POST (relayed without looking at the method).
        HttpPost => "POST",
        /// A legacy client's GET stream.
        HttpGet => "GET",
        /// A legacy client's DELETE.
        HttpDelete => "DELETE",
    }
}

label_values! {
    /// How a request ended.
    Outcome {
        /// A result (`complete`, or a list, discover, an acknowledged listen stream).
        Complete => "complete",
        /// An `input_required` round.
        InputRequired => "input_required",
        /// A `tools/call` answered with a task (`resultType: "task"`).
        Task => "task",
        /// The client left before the answer.
        Cancelled => "cancelled",
        /// Refused because of the request (4xx, or a JSON-RPC error the upstream answered).
        ClientError => "client_error",
        /// The upstream failed (502/504).
        UpstreamError => "upstream_error",
        /// The proxy failed or was at a limit (500/503).
        ProxyError => "proxy_error",
        /// Relayed for a legacy client (whatever the upstream answered).
        Relayed => "relayed",
    }
}

label_values! {
    /// Why a requestState (or the answers beside it) was refused.
    TokenRejection {
        Invalid => "invalid",
        Expired => "expired",
        WrongPrincipal => "wrong_principal",
        WrongRequest => "wrong_request",
        AlreadyUsed => "already_used",
        NotYetValid => "not_yet_valid",
        Gone => "gone",
        /// `requestState` not a string, `inputResponses` not an object, or answers of the wrong shape.
        Malformed => "malformed",
    }
}

label_values! {
    /// The capability a -32021 said was missing.
    Capability {
        ElicitationForm => "elicitation.form",
        ElicitationUrl => "elicitation.url",
        Sampling => "sampling",
        SamplingTools => "sampling.tools",
        Roots => "roots",
    }
}

label_values! {
    /// What went wrong talking to the upstream.
    UpstreamFailure {
        Connect => "connect",
        Timeout => "timeout",
        Status => "status",
        Unauthorized => "unauthorized",
        Protocol => "protocol",
        SessionGone => "session_gone",
        Closed => "closed",
        Sse => "sse",
        PoolBusy => "pool_busy",
        Starting => "starting",
    }
}

label_values! {
    /// A bound that refused or shed something.
    Limit {
        /// `server.max_requests_per_principal` (429).
        PrincipalRequests => "principal_requests",
        /// `state.max_parked`, `state.max_parked_per_principal` or `state.max_parked_memory`.
        Parked => "parked",
        /// `server.max_connections`: an idle keep-alive connection closed to admit a new one.
        IdleConnectionShed => "idle_connection_shed",
        /// `pool.max_listen_sessions_per_principal` or `server.max_legacy_sessions_per_principal`:
        /// the principal holds its share of the upstream sessions (503).
        PrincipalSessions => "principal_sessions",
        /// `pool.max_extension_sets_per_principal`: a request served without its extensions.
        ExtensionSets => "extension_sets",
    }
}

label_values! {
    /// Why accepting a connection failed.
    AcceptFailure {
        /// The process or the system is out of file descriptors (`EMFILE`, `ENFILE`).
        Descriptors => "descriptors",
        /// The connection was gone before it was accepted (aborted, reset): only that one lost.
        Connection => "connection",
        /// Anything else, such as the kernel out of buffers or memory (`ENOBUFS`, `ENOMEM`).
        Other => "other",
    }
}

label_values! {
    /// How a round was gathered (`state.gather`).
    Gathered {
        /// It waited out `state.gather_window` for more server requests.
        Window => "window",
        /// It took only the requests already read: its target is known to ask one at a time.
        Arrived => "arrived",
    }
}

label_values! {
    /// What became of a retry whose requestState names another instance.
    Forward {
        /// Sent to the owner, whose answer was streamed back.
        Ok => "ok",
        /// No known peer is the owner (it left the peer set, or restarted under a new id).
        UnknownOwner => "unknown_owner",
        /// The owner is known but refused the connection, or it broke.
        Unreachable => "unreachable",
        /// The owner is known but did not answer within `cluster.forward_timeout`.
        Timeout => "timeout",
        /// Arrived already forwarded for a call this instance does not own: never a second hop.
        Loop => "loop",
    }
}

label_values! {
    /// What a forward to another instance carried.
    ForwardKind {
        /// A retry whose requestState names the instance holding its call.
        Retry => "retry",
        /// A `tasks/*` request of a task the instance owns.
        Task => "task",
    }
}

label_values! {
    /// How a key reload (SIGHUP) ended.
    Reload {
        Ok => "ok",
        Error => "error",
    }
}

label_values! {
    /// Which way relayed bytes went.
    Direction {
        ToUpstream => "to_upstream",
        ToClient => "to_client",
    }
}

impl Method {
    /// The label of a JSON-RPC method name.
    pub(crate) fn of(method: &str) -> Self {
        match method {
            "server/discover" => Self::Discover,
            "subscriptions/listen" => Self::Listen,
            "tools/call" => Self::ToolsCall,
            "prompts/get" => Self::PromptsGet,
            "resources/read" => Self::ResourcesRead,
            "tools/list" => Self::ToolsList,
            "prompts/list" => Self::PromptsList,
            "resources/list" => Self::ResourcesList,
            "resources/templates/list" => Self::ResourceTemplatesList,
            "completion/complete" => Self::Complete,
            "tasks/get" => Self::TasksGet,
            "tasks/update" => Self::TasksUpdate,
            "tasks/cancel" => Self::TasksCancel,
            _ => Self::Other,
        }
    }

    /// The label of a legacy client's HTTP method.
    pub(crate) fn of_http(method: &http::Method) -> Self {
        match *method {
            http::Method::GET => Self::HttpGet,
            http::Method::DELETE => Self::HttpDelete,
            _ => Self::HttpPost,
        }
    }
}

impl AcceptFailure {
    /// The label of an error `accept` returned.
    pub(crate) fn of(error: &std::io::Error) -> Self {
        use std::io::ErrorKind;
        match (error.raw_os_error(), error.kind()) {
            (Some(libc::EMFILE | libc::ENFILE), _) => Self::Descriptors,
            (
                _,
                ErrorKind::ConnectionAborted
                | ErrorKind::ConnectionReset
                | ErrorKind::ConnectionRefused
                | ErrorKind::Interrupted,
            ) => Self::Connection,
            _ => Self::Other,
        }
    }
}

label_values! {
    /// Why `[auth]` refused a request.
    AuthRefusal {
        /// Resource-server mode, no token: 401.
        Missing => "missing",
        /// A token that does not verify (bad, expired, another audience, unknown key): 401.
        Invalid => "invalid",
        /// A tool's scope the token lacks: 403.
        Scope => "insufficient_scope",
        /// The authorization server could not be asked: 503.
        Unavailable => "unavailable",
    }
}

label_values! {
    /// An endpoint of the authorization server.
    AuthEndpoint {
        /// The JWK set.
        Jwks => "jwks",
        /// The RFC 7662 introspection endpoint.
        Introspection => "introspection",
    }
}

label_values! {
    /// Why a token was not introspected (no request to the authorization server).
    IntrospectionSkip {
        /// The server called the same token inactive (or unusable) within
        /// `negative_cache_max_age`: 401 again, from the cache.
        NegativeCache => "negative_cache",
        /// Past `max_rate` / `max_burst`: 503 + `Retry-After`.
        RateBound => "rate_bound",
    }
}

label_values! {
    /// How a request to the authorization server went.
    FetchResult {
        /// A usable answer.
        Ok => "ok",
        /// None: unreachable, timed out, an error status, not JSON.
        Error => "error",
    }
}

label_values! {
    /// What the approval gate decided for a call of a gated tool.
    Decision {
        /// The person was asked (an `input_required` round went out).
        Asked => "asked",
        /// The person approved: the call went upstream.
        Approved => "approved",
        /// The person declined or cancelled: the upstream never saw the call.
        Declined => "declined",
        /// The client cannot be asked (no form elicitation declared): -32021.
        Unaskable => "unaskable",
        /// A legacy client's call of a gated tool, refused (its session declared no elicitation,
        /// or the call came in a batch).
        LegacyRefused => "legacy_refused",
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RequestLabels {
    pub(super) era: Era,
    pub(super) method: Method,
    pub(super) outcome: Outcome,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct LatencyLabels {
    pub(super) era: Era,
    pub(super) method: Method,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReasonLabel {
    pub(super) reason: TokenRejection,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CapabilityLabel {
    pub(super) capability: Capability,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KindLabel {
    pub(super) kind: UpstreamFailure,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DirectionLabel {
    pub(super) direction: Direction,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ForwardLabel {
    pub(super) kind: ForwardKind,
    pub(super) result: Forward,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct GatherLabel {
    pub(super) wait: Gathered,
}

label_values! {
    /// Why the trace export lost spans.
    SpanDrop {
        /// Its queue (`telemetry.max_queue`) was full: the collector is slower than the proxy.
        QueueFull => "queue_full",
        /// The collector did not take a batch (down, refused, or past `telemetry.export_timeout`).
        ExportFailed => "export_failed",
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SpanDropLabel {
    pub(super) reason: SpanDrop,
}

label_values! {
    /// A W3C trace-context value of a request.
    TraceField {
        Traceparent => "traceparent",
        Tracestate => "tracestate",
        Baggage => "baggage",
    }
}

label_values! {
    /// Why a trace-context value was not sent on, whole or in part.
    TraceDrop {
        /// It, or some of its members, did not parse (W3C Trace Context, W3C Baggage).
        Invalid => "invalid",
        /// Some of its members were past the W3C bounds (`tracestate`: 32 members, 512
        /// characters; `baggage`: 180 members, 8192 bytes).
        Oversized => "oversized",
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TraceDropLabels {
    pub(super) field: TraceField,
    pub(super) reason: TraceDrop,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct LimitLabel {
    pub(super) limit: Limit,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct AcceptLabel {
    pub(super) kind: AcceptFailure,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReloadLabel {
    pub(super) result: Reload,
}

label_values! {
    /// A task's status (the extension's five).
    TaskState {
        Working => "working",
        InputRequired => "input_required",
        Completed => "completed",
        Failed => "failed",
        Cancelled => "cancelled",
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TaskStateLabel {
    pub(super) status: TaskState,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct AuthRefusalLabel {
    pub(super) reason: AuthRefusal,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct AuthFetchLabels {
    pub(super) endpoint: AuthEndpoint,
    pub(super) result: FetchResult,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct IntrospectionSkipLabel {
    pub(super) reason: IntrospectionSkip,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DecisionLabel {
    pub(super) decision: Decision,
}
