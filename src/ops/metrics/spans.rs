//! Spans the trace export lost, by why. One family for the process: the export starts before
//! the app (and its registry) and outlives none of it; every registry shows the same counts.

use std::sync::LazyLock;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::labels::{SpanDrop, SpanDropLabel};

static DROPPED: LazyLock<Family<SpanDropLabel, Counter>> = LazyLock::new(Family::default);

/// `count` spans were lost for `reason`.
pub(crate) fn spans_dropped(reason: SpanDrop, count: u64) {
    DROPPED
        .get_or_create(&SpanDropLabel { reason })
        .inc_by(count);
}

pub(super) fn register(r: &mut Registry) {
    r.register(
        "trace_spans_dropped",
        "Spans the trace export dropped: its queue was full, or the collector did not take them",
        DROPPED.clone(),
    );
}
