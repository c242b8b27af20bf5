//! What the gauges read from the proxy's state at each scrape.

/// Gauges read from the proxy's state at scrape time.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Snapshot {
    /// Calls parked now.
    pub(crate) parked: usize,
    /// Bytes charged to parked calls now (see `state.max_parked_memory`).
    pub(crate) parked_bytes: usize,
    /// Bytes charged to tasks now (see `tasks.max_memory`).
    pub(crate) task_bytes: usize,
    /// Upstream sessions open now (leased and idle).
    pub(crate) sessions: usize,
    /// Idle upstream sessions now.
    pub(crate) idle_sessions: usize,
    /// Requests waiting for a session now.
    pub(crate) session_waiters: usize,
    /// Upstream sessions `subscriptions/listen` streams pin now.
    pub(crate) listen_sessions: usize,
    /// Legacy clients' sessions the proxy serves itself now (see `bridge`).
    pub(crate) legacy_sessions: usize,
}
