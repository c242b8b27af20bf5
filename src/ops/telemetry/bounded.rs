//! The export's bound, counted: at most `telemetry.max_queue` spans wait for (or are in) an
//! export; a span past it is dropped at once, and so is a batch the collector did not take —
//! each counted in `mrtr_trace_spans_dropped_total` by why. The SDK's batch processor drops
//! silently when its queue is full; here its queue is never the one that fills.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;

use crate::ops::metrics::{spans_dropped, SpanDrop};

/// Spans taken and not yet exported (or lost), shared by the processor and the exporter.
#[derive(Debug, Clone, Default)]
pub(super) struct Pending(Arc<AtomicUsize>);

/// A span processor that admits at most `max` pending spans into `inner`.
#[derive(Debug)]
pub(super) struct Bounded<P> {
    inner: P,
    pending: Pending,
    max: usize,
}

impl<P> Bounded<P> {
    pub(super) fn new(inner: P, pending: Pending, max: usize) -> Self {
        Self {
            inner,
            pending,
            max,
        }
    }
}

impl<P: SpanProcessor> SpanProcessor for Bounded<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        let taken = self
            .pending
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            });
        match taken {
            Ok(_) => self.inner.on_end(span),
            Err(_) => spans_dropped(SpanDrop::QueueFull, 1),
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// An exporter that settles each batch's pending spans, counting a failed batch as lost.
#[derive(Debug)]
pub(super) struct Counted<E> {
    inner: E,
    pending: Pending,
}

impl<E> Counted<E> {
    pub(super) fn new(inner: E, pending: Pending) -> Self {
        Self { inner, pending }
    }
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let count = batch.len();
        let result = self.inner.export(batch).await;
        self.pending.0.fetch_sub(count, Ordering::AcqRel);
        if result.is_err() {
            spans_dropped(SpanDrop::ExportFailed, count as u64);
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
