//! A handful of counters, rendered as Prometheus text on `GET /metrics`. No ids, no paths.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Process-wide counters (one instance in `App`).
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    /// Modern requests accepted past validation.
    pub(crate) modern_requests: AtomicU64,
    /// Requests relayed for legacy clients.
    pub(crate) legacy_requests: AtomicU64,
    /// Requests rejected at validation (4xx).
    pub(crate) rejected_requests: AtomicU64,
    /// `input_required` results sent (rounds).
    pub(crate) rounds: AtomicU64,
    /// Input requests (keys) sent across all rounds.
    pub(crate) input_requests: AtomicU64,
    /// Retries that resumed a parked call.
    pub(crate) resumes: AtomicU64,
    /// requestStates refused.
    pub(crate) rejected_states: AtomicU64,
    /// Parked calls ended by their TTL.
    pub(crate) expired: AtomicU64,
}

impl Metrics {
    /// Adds one to a counter.
    pub(crate) fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// An `input_required` round with `keys` input requests was sent.
    pub(crate) fn round_sent(&self, keys: usize) {
        Self::inc(&self.rounds);
        self.input_requests
            .fetch_add(keys as u64, Ordering::Relaxed);
    }

    /// A parked call reached its deadline.
    pub(crate) fn call_expired(&self) {
        Self::inc(&self.expired);
    }

    /// Prometheus text exposition; `parked`, `idle_sessions` and `session_waiters` are gauges read
    /// by the caller.
    pub(crate) fn render(
        &self,
        parked: usize,
        idle_sessions: usize,
        session_waiters: usize,
    ) -> String {
        let mut out = String::new();
        for (name, help, c) in self.counters() {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                c.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(out, "# HELP mrtr_parked_calls Calls parked now\n# TYPE mrtr_parked_calls gauge\nmrtr_parked_calls {parked}");
        let _ = writeln!(out, "# HELP mrtr_idle_sessions Idle upstream sessions\n# TYPE mrtr_idle_sessions gauge\nmrtr_idle_sessions {idle_sessions}");
        let _ = writeln!(out, "# HELP mrtr_session_waiters Requests waiting for an upstream session (pool full)\n# TYPE mrtr_session_waiters gauge\nmrtr_session_waiters {session_waiters}");
        out
    }

    fn counters(&self) -> [(&'static str, &'static str, &AtomicU64); 8] {
        [
            (
                "mrtr_modern_requests_total",
                "Modern requests accepted",
                &self.modern_requests,
            ),
            (
                "mrtr_legacy_requests_total",
                "Legacy requests relayed",
                &self.legacy_requests,
            ),
            (
                "mrtr_rejected_requests_total",
                "Requests rejected at validation",
                &self.rejected_requests,
            ),
            (
                "mrtr_rounds_total",
                "input_required results sent",
                &self.rounds,
            ),
            (
                "mrtr_input_requests_total",
                "Input requests sent in rounds",
                &self.input_requests,
            ),
            (
                "mrtr_resumes_total",
                "Retries that resumed a parked call",
                &self.resumes,
            ),
            (
                "mrtr_rejected_states_total",
                "requestStates refused",
                &self.rejected_states,
            ),
            (
                "mrtr_expired_calls_total",
                "Parked calls ended by their TTL",
                &self.expired,
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_gauges() {
        let m = Metrics::default();
        Metrics::inc(&m.rounds);
        let text = m.render(2, 3, 4);
        assert!(text.contains("mrtr_rounds_total 1\n"));
        assert!(text.contains("mrtr_parked_calls 2\n"));
        assert!(text.contains("mrtr_idle_sessions 3\n"));
        assert!(text.contains("mrtr_session_waiters 4\n"));
    }
}
