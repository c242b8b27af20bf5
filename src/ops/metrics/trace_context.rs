//! Clients' W3C trace context the proxy did not send on, by value and why (never the value).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::labels::{TraceDrop, TraceDropLabels, TraceField};

/// Trace-context drops.
#[derive(Debug, Default)]
pub(crate) struct TraceContextMetrics {
    dropped: Family<TraceDropLabels, Counter>,
}

impl TraceContextMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "trace_context_dropped",
            "Requests whose traceparent, tracestate or baggage was not sent on, whole or in part, by why",
            self.dropped.clone(),
        );
    }

    /// A request's `field` was not sent on, whole or in part, for `reason`.
    pub(crate) fn dropped(&self, field: TraceField, reason: TraceDrop) {
        self.dropped
            .get_or_create(&TraceDropLabels { field, reason })
            .inc();
    }
}
